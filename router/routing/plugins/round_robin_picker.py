"""round-robin-picker: the k-th routed request goes to candidate k mod n.

The baseline with no signal at all. Candidates are taken in the order the caller
lists them (replica order); the counter advances only when a decision is taken
(``on_routed``), so ranking twice without routing gives the same answer.
"""

from __future__ import annotations

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import NoParams, register


@register("round-robin-picker", "picker")
class RoundRobinPicker:
    def __init__(self, params: NoParams) -> None:
        self.params = params
        self._next = 0

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]:
        cands = ctx.candidates
        if not cands:
            return []
        i = self._next % len(cands)
        return cands[i:] + cands[:i]

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        self._next += 1
