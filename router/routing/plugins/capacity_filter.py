"""capacity-filter: drop replicas at their ``max_ongoing_requests``.

If every replica is full, keep them all: Serve's router then queues the
request and backs off instead of the ingress failing it.
"""

from __future__ import annotations

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import NoParams, register


@register("capacity-filter", "filter")
class CapacityFilter:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def filter(self, ctx: RequestContext) -> list[Candidate]:
        return [c for c in ctx.candidates if c.ongoing < c.max_ongoing] or ctx.candidates
