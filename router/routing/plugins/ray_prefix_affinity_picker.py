"""ray-prefix-affinity-picker: Ray Serve LLM's ``PrefixCacheAffinityRouter``.

State: an approximate prefix tree per replica (``approx_tree``) into which every
routed prompt is inserted for the replica that got it. Load is requests in flight
(Serve's queue length).

Decision, in order:

1. Imbalanced load, ``max - min > imbalanced_threshold`` (10): power of two
   choices (two random replicas, the less loaded).
2. Else, if the best tree match covers at least ``match_rate_threshold`` (0.1) of
   the prompt: among the replicas with that match, the least loaded.
3. Else: among the replicas with the smallest tree, the least loaded.

Ray only evicts from its tree when ``do_eviction`` is set (then every 10 s, above
a character threshold); here every tree is trimmed to ``max_blocks`` (32768 blocks, 2M
tokens at 64 a block, SGLang's cap; None: never, as Ray's default) every ``trim_interval_s``
(Ray's eviction interval), so the router's memory stays bounded. Ties
go to the first candidate.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from router.routing.context import Candidate, RequestContext
from router.routing.plugins import approx_tree as at
from router.routing.plugins.base import register
from router.routing.plugins.power_of_two_picker import pow2_choice


class RayParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    imbalanced_threshold: int = Field(10, ge=0, description="Queue gap that means imbalance.")
    match_rate_threshold: float = Field(0.1, ge=0.0, le=1.0, description="Match share to follow.")
    trim_interval_s: float = Field(10.0, gt=0, description="Seconds between tree evictions.")
    max_blocks: int | None = Field(32768, ge=1, description="Blocks kept per replica tree "
                                   "(trimmed every trim_interval_s); None: never trimmed.")
    seed: int = Field(0, description="Seed of the power-of-two fallback.")


@register("ray-prefix-affinity-picker", "picker")
class RayPrefixAffinityPicker(at.TreePicker):
    Params = RayParams

    def __init__(self, params: RayParams) -> None:
        super().__init__(params)
        self._rng = random.Random(params.seed)

    def _choose(self, ctx: RequestContext, cands: list[Candidate]) -> Candidate:
        p = self.params
        gap = max(c.ongoing for c in cands) - min(c.ongoing for c in cands)
        if gap > p.imbalanced_threshold:
            return pow2_choice(self._rng, cands)
        blocks, holders = at.tree_match(self.tree, ctx)
        if holders and at.match_share(ctx, holders[0], blocks) >= p.match_rate_threshold:
            return at.least_loaded(holders)
        return at.least_loaded(at.smallest_tree(self.tree, cands))
