"""model-preference-scorer: the group's preference weight of the candidate's model.

With ``coder -> [big: 1.0, small: 0.6]`` a replica of ``big`` scores 1.0 and one
of ``small`` 0.6. Weighed against the estimated-TTFT scorer, this is what keeps a
conversation on the model whose cache is warm unless the preferred model's gain
outweighs re-prefilling the conversation there.
"""

from __future__ import annotations

from router.routing.context import RequestContext
from router.routing.plugins.base import NoParams, register


@register("model-preference-scorer", "scorer")
class ModelPreferenceScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        top = max(ctx.model_weights.values(), default=1.0) or 1.0
        return [ctx.model_weights.get(c.model, 1.0) / top for c in ctx.candidates]
