"""ongoing-requests-scorer: fewer requests in flight is better (decode contention)."""

from __future__ import annotations

from router.routing.context import RequestContext
from router.routing.plugins.base import NoParams, register


@register("ongoing-requests-scorer", "scorer")
class OngoingRequestsScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        return [1.0 / (1.0 + c.ongoing) for c in ctx.candidates]
