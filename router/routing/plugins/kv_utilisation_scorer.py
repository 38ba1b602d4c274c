"""kv-utilisation-scorer: replicas with free KV cache score higher (1 - usage).

A nearly full cache evicts what the next requests would reuse, and on vLLM it
ends in preemption; this spreads new prefixes toward room.
"""

from __future__ import annotations

from router.routing.context import RequestContext
from router.routing.plugins.base import NoParams, register


@register("kv-utilisation-scorer", "scorer")
class KvUtilisationScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        return [max(0.0, min(1.0, 1.0 - c.kv_usage)) for c in ctx.candidates]
