"""tools-filter: a request that carries tools goes to models that can call tools."""

from __future__ import annotations

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import NoParams, register


@register("tools-filter", "filter")
class ToolsFilter:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def filter(self, ctx: RequestContext) -> list[Candidate]:
        if not ctx.has_tools or ctx.tool_models is None:
            return ctx.candidates
        able = [c for c in ctx.candidates if c.model in ctx.tool_models]
        return able or ctx.candidates
