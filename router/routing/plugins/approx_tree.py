"""An approximate prefix tree per replica, learned from routing history only.

This is the state the SGLang router (``cache_aware``) and Ray Serve's
``PrefixCacheAffinityRouter`` keep: they never hear from the engines' caches, so
they *assume* a replica holds every prompt they sent it, until the tree is trimmed.
The baseline pickers use it, and share the helpers and ``TreePicker`` shell at the end of
this module; kvroute's own scorers read the real index instead.

Representation. Block hashes are chained (the hash at position i names the whole
prefix up to block i), so a radix tree over them collapses to a set of hashes per
tenant: a tenant "has" prefix ``h[:k]`` iff it holds ``h[k-1]``, and a match is the
longest leading run of hashes the tenant holds. Each tenant's set is an LRU
(``OrderedDict``). Inserting a prompt touches its blocks deepest first, so a parent
is always more recent than its children and LRU order evicts leaves first, as
SGLang's leaf eviction by last access time does.

Trimming. ``maybe_trim(now)`` trims every tenant to ``max_blocks`` (LRU first) when
``trim_interval_s`` has passed since the last trim, like SGLang's periodic eviction
thread (120 s) and Ray's eviction loop. Between trims a tree may exceed the cap.
Tree size, for "the smallest tree", is the number of blocks a tenant holds (SGLang
counts characters, Ray characters too; blocks are our unit of text).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from router.routing.context import Candidate, RequestContext
from router.routing.plugins.power_of_two_picker import rank_first

Tenant = Hashable


class ApproxPrefixTree:
    def __init__(self, max_blocks: int | None, trim_interval_s: float) -> None:
        self.max_blocks = max_blocks  # None: never trimmed
        self.trim_interval_s = trim_interval_s
        self._tenants: dict[Tenant, OrderedDict[int, None]] = {}
        self._last_trim: float | None = None

    def insert(self, tenant: Tenant, hashes: Sequence[int]) -> None:
        blocks = self._tenants.setdefault(tenant, OrderedDict())
        for h in reversed(hashes):  # deepest first: parents end up more recent
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None

    def match(self, tenant: Tenant, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the tenant is assumed to hold."""
        blocks = self._tenants.get(tenant)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def size(self, tenant: Tenant) -> int:
        return len(self._tenants.get(tenant, ()))

    def best_match(
        self, hashes_by_tenant: Iterable[tuple[Tenant, Sequence[int]]],
    ) -> tuple[int, list[Tenant]]:
        """The longest match over tenants and every tenant achieving it (input order)."""
        best, holders = 0, []
        for tenant, hashes in hashes_by_tenant:
            n = self.match(tenant, hashes)
            if n > best:
                best, holders = n, [tenant]
            elif n == best and n > 0:
                holders.append(tenant)
        return best, holders

    def smallest(self, tenants: Iterable[Tenant]) -> list[Tenant]:
        """Every tenant with the smallest tree (input order); unseen tenants have 0."""
        tenants = list(tenants)
        low = min((self.size(t) for t in tenants), default=0)
        return [t for t in tenants if self.size(t) == low]

    def maybe_trim(self, now: float) -> bool:
        """Trim when ``trim_interval_s`` has passed since the last trim (the first call
        starts the clock). Returns whether it trimmed."""
        if self._last_trim is None:
            self._last_trim = now
            return False
        if now - self._last_trim < self.trim_interval_s:
            return False
        self._last_trim = now
        self.trim()
        return True

    def trim(self) -> None:
        if self.max_blocks is None:
            return
        for blocks in self._tenants.values():
            while len(blocks) > self.max_blocks:
                blocks.popitem(last=False)


# ---- shared by the tree-based baseline pickers (sglang-cache-aware, ray-prefix-affinity) ----

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


class TreePicker:
    """The shell both tree-based baselines share: trim the tree, choose one replica, rank it
    first, learn the choice. Subclasses implement ``_choose``; their params carry the tree's
    ``max_blocks`` and ``trim_interval_s``."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.tree = ApproxPrefixTree(params.max_blocks, params.trim_interval_s)

    def pick(self, ctx: RequestContext, totals: list[float]) -> list[Candidate]:
        cands = ctx.candidates
        if not cands:
            return []
        self.tree.maybe_trim(ctx.now)
        return rank_first(cands, self._choose(ctx, cands))

    def _choose(self, ctx: RequestContext, cands: list[Candidate]) -> Candidate:
        raise NotImplementedError

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        self.tree.insert((chosen.model, chosen.replica), ctx.hashes.get(chosen.model, []))
