"""model-cost-scorer: cheaper models score higher (cheapest / this model's cost)."""

from __future__ import annotations

from router.routing.context import RequestContext
from router.routing.plugins.base import NoParams, register


@register("model-cost-scorer", "scorer")
class ModelCostScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        costs = [ctx.model_costs.get(c.model, 0.0) for c in ctx.candidates]
        priced = [x for x in costs if x > 0]
        if not priced:
            return [1.0] * len(costs)
        cheapest = min(priced)
        return [1.0 if x <= 0 else cheapest / x for x in costs]
