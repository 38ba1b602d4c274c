"""max-score-picker: rank by weighted total score.

Ties go to the candidate with fewer requests in flight, then to the one this
router has used least, which spreads unrelated conversations over replicas
instead of piling them onto the first.
"""

from __future__ import annotations

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import NoParams, register


@register("max-score-picker", "picker")
class MaxScorePicker:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]:
        cands = ctx.candidates
        order = sorted(
            range(len(cands)),
            key=lambda i: (-round(totals[i], 9), cands[i].ongoing, cands[i].routed, i),
        )
        return [cands[i] for i in order]
