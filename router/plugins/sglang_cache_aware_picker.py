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

from router.context import Candidate, RequestContext
from router.plugins.approx_tree import ApproxPrefixTree
from router.plugins.base import register
from router.plugins.power_of_two_picker import rank_first


class SglangParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    balance_abs_threshold: int = Field(64, ge=0, description="Load gap (requests) to rebalance.")
    balance_rel_threshold: float = Field(1.5, ge=1.0, description="Load ratio to rebalance.")
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0, description="Match share to follow.")
    trim_interval_s: float = Field(120.0, gt=0, description="Seconds between tree trims.")
    max_blocks: int | None = Field(32768, ge=1, description="Blocks kept per replica tree.")


def match_share(ctx: RequestContext, c: Candidate, blocks: int) -> float:
    """Share of the prompt's tokens covered by ``blocks`` leading blocks."""
    total = ctx.prompt_tokens.get(c.model, 0)
    return min(1.0, blocks * ctx.block_size / total) if total else 0.0


def tree_match(
    tree: ApproxPrefixTree, ctx: RequestContext,
) -> tuple[int, list[Candidate]]:
    """Best tree match (blocks) over the candidates and the candidates achieving it."""
    pairs = [((c.model, c.replica), ctx.hashes.get(c.model, [])) for c in ctx.candidates]
    blocks, tenants = tree.best_match(pairs)
    keys = set(tenants)
    return blocks, [c for c in ctx.candidates if (c.model, c.replica) in keys]


def smallest_tree(tree: ApproxPrefixTree, cands: list[Candidate]) -> list[Candidate]:
    keys = set(tree.smallest((c.model, c.replica) for c in cands))
    return [c for c in cands if (c.model, c.replica) in keys]


def least_loaded(cands: list[Candidate]) -> Candidate:
    return min(cands, key=lambda c: c.ongoing)  # min keeps the first of equals


@register("sglang-cache-aware-picker", "picker")
class SglangCacheAwarePicker:
    Params = SglangParams

    def __init__(self, params: SglangParams) -> None:
        self.params = params
        self.tree = ApproxPrefixTree(params.max_blocks, params.trim_interval_s)

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]:
        cands = ctx.candidates
        if not cands:
            return []
        self.tree.maybe_trim(ctx.now)
        return rank_first(cands, self._choose(ctx, cands))

    def _choose(self, ctx: RequestContext, cands: list[Candidate]) -> Candidate:
        p = self.params
        hi = max(c.ongoing for c in cands)
        lo = min(c.ongoing for c in cands)
        if hi - lo > p.balance_abs_threshold and hi > p.balance_rel_threshold * lo:
            return least_loaded(cands)
        blocks, holders = tree_match(self.tree, ctx)
        if holders and match_share(ctx, holders[0], blocks) > p.cache_threshold:
            return least_loaded(holders)
        return smallest_tree(self.tree, cands)[0]

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        self.tree.insert((chosen.model, chosen.replica), ctx.hashes.get(chosen.model, []))
