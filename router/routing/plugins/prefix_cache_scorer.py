"""prefix-cache-scorer: the share of the prompt a replica already holds.

Reads the index's match info (engine-confirmed and in-flight routed blocks).
"""

from __future__ import annotations

from router.routing.context import RequestContext
from router.routing.plugins.base import NoParams, register


@register("prefix-cache-scorer", "scorer")
class PrefixCacheScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        out = []
        for c in ctx.candidates:
            total = ctx.prompt_tokens.get(c.model, 0)
            out.append(min(1.0, c.matched_tokens / total) if total else 0.0)
        return out
