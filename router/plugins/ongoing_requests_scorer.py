"""ongoing-requests-scorer: fewer requests in flight is better (decode contention)."""

from __future__ import annotations

from typing import ClassVar

from router.context import RequestContext
from router.plugins.base import register


@register("ongoing-requests-scorer")
class OngoingRequestsScorer:
    name: ClassVar[str]

    def score(self, ctx: RequestContext) -> list[float]:
        return [1.0 / (1.0 + c.ongoing) for c in ctx.candidates]
