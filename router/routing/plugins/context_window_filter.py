"""context-window-filter: drop models too small for the prompt plus its output budget.

Only matters when a request names a group of models; if no model fits, the
candidates are kept and the route's own 413 check decides.
"""

from __future__ import annotations

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import NoParams, register


@register("context-window-filter", "filter")
class ContextWindowFilter:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def filter(self, ctx: RequestContext) -> list[Candidate]:
        def fits(c: Candidate) -> bool:
            window = ctx.context_windows.get(c.model)
            return window is None or ctx.prompt_tokens.get(c.model, 0) + ctx.max_tokens <= window

        return [c for c in ctx.candidates if fits(c)] or ctx.candidates
