"""sglang-cache-aware-picker: SGLang router's ``cache_aware`` policy, as published.

State: an approximate prefix tree per replica (``approx_tree``), built only from
this router's own decisions: every routed prompt is inserted into the chosen
replica's tree, whichever branch chose it. Load is requests in flight per replica.

Decision, in order:

1. Imbalanced load, ``max - min > balance_abs_threshold`` (64) and
   ``max > balance_rel_threshold * min`` (1.5): the least loaded replica.
2. Else, if the best tree match covers more than ``cache_threshold`` (0.3) of the
   prompt: the replica with that match.
3. Else: the replica with the smallest tree (the least cached state).

The tree is trimmed every ``trim_interval_s`` (120 s) to ``max_blocks`` per
replica, LRU leaves first. The default cap is SGLang's ``max_tree_size`` of 2**26
characters at ~4 characters per token in 512-token blocks (32768 blocks).

Where SGLang leaves a choice open we pick deterministically, never against the
baseline: ties in the best match go to the replica with fewer requests in
flight (SGLang takes whichever tenant its map yields first); ties in load or
tree size go to the first candidate.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.routing.context import Candidate, RequestContext
from router.routing.plugins import approx_tree as at
from router.routing.plugins.base import register


class SglangParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    balance_abs_threshold: int = Field(64, ge=0, description="Load gap (requests) to rebalance.")
    balance_rel_threshold: float = Field(1.5, ge=1.0, description="Load ratio to rebalance.")
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0, description="Match share to follow.")
    trim_interval_s: float = Field(120.0, gt=0, description="Seconds between tree trims.")
    max_blocks: int | None = Field(32768, ge=1, description="Blocks kept per replica tree.")


@register("sglang-cache-aware-picker", "picker")
class SglangCacheAwarePicker(at.TreePicker):
    Params = SglangParams


    def _choose(self, ctx: RequestContext, cands: list[Candidate]) -> Candidate:
        p = self.params
        hi = max(c.ongoing for c in cands)
        lo = min(c.ongoing for c in cands)
        if hi - lo > p.balance_abs_threshold and hi > p.balance_rel_threshold * lo:
            return at.least_loaded(cands)
        blocks, holders = at.tree_match(self.tree, ctx)
        if holders and at.match_share(ctx, holders[0], blocks) > p.cache_threshold:
            return at.least_loaded(holders)
        return at.smallest_tree(self.tree, cands)[0]
