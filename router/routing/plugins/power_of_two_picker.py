"""power-of-two-picker: sample two candidates at random, take the less loaded.

"The power of two choices" (Mitzenmacher, 2001), Ray Serve's default request
router: load is requests in flight (``ongoing``, Serve's queue length). Ties
keep the first sampled. The generator is seeded (``seed``), so runs repeat.
``pow2_choice`` is shared with ray-prefix-affinity-picker, which falls back to it.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.base import register


def pow2_choice(rng: random.Random, cands: list[Candidate]) -> Candidate:
    if len(cands) == 1:
        return cands[0]
    a, b = rng.sample(cands, 2)
    return b if b.ongoing < a.ongoing else a


def rank_first(cands: list[Candidate], chosen: Candidate) -> list[Candidate]:
    """``chosen`` first, then the others by requests in flight (the retry order)."""
    rest = sorted((c for c in cands if c is not chosen), key=lambda c: c.ongoing)
    return [chosen, *rest]


class Pow2Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seed of the random sampling.")


@register("power-of-two-picker", "picker")
class PowerOfTwoPicker:
    Params = Pow2Params

    def __init__(self, params: Pow2Params) -> None:
        self.params = params
        self._rng = random.Random(params.seed)

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]:
        if not ctx.candidates:
            return []
        return rank_first(ctx.candidates, pow2_choice(self._rng, ctx.candidates))
