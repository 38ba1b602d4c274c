"""Bounded state: each per-request, per-session or per-replica map a
long-lived router object keeps is filled past its bound here, and must stay at it.

Maps bounded by construction (and why) are listed in docs/reliability.md, "Bounded state"."""

from __future__ import annotations

import asyncio

from cache_service import IndexSettings, MemoryPrefixIndex
from cache_service.memory_index import MAX_SESSIONS
from router.routing import estimates
from router.routing.context import Candidate
from router.routing.plugins import make_plugin
from tests.router.routing.test_baseline_plugins import _cands, _ctx, _route


def test_memory_index_keeps_session_digests_and_at_most_max_sessions() -> None:
    """Session ids were kept verbatim (40 x 2 MiB ids: +98 MiB) and by count only."""
    index = MemoryPrefixIndex(IndexSettings())

    async def fill() -> tuple[str, str] | None:
        long_id = "u" * 256 + "#agent:" + "a" * 64
        await index.record_session(long_id, "m", "r-long")
        for i in range(MAX_SESSIONS + 50):
            await index.record_session(f"s{i}", "m", "r")
        await index.record_session(long_id, "m", "r-long")  # most recent again
        return await index.session(long_id)

    assert asyncio.run(fill()) == ("m", "r-long")
    sessions = index._sessions
    assert len(sessions) == MAX_SESSIONS
    assert all(isinstance(k, bytes) and len(k) == 16 for k in sessions)  # digests only


def test_prefill_rates_forget_the_least_recently_seen_replicas() -> None:
    """Autoscaling and restarts bring new replica ids for the router's lifetime."""
    cap = getattr(estimates, "MAX_RATE_REPLICAS", 4096)  # (absent before the bound)
    rates = estimates.PrefillRates(0.3, 0.0)
    keep = Candidate("m", "steady", prefill_tokens_total=1000, prefill_busy_s=1.0)
    rates.observe(keep)
    for i in range(cap + 100):
        rates.observe(Candidate("m", f"r{i}", prefill_tokens_total=10 * i, prefill_busy_s=0.1))
        if i % 1000 == 0:
            rates.observe(keep)  # still live: seen now and then
    assert len(rates._state) == cap
    assert sum(len(f) for f in rates._fleet.values()) <= cap
    assert ("m", "steady") in rates._state and ("m", "r0") not in rates._state


def test_ray_prefix_affinity_tree_is_trimmed_by_default() -> None:
    """The baseline profile's tree was never trimmed (max_blocks None)."""
    p = make_plugin("ray-prefix-affinity-picker", "picker", {})
    cap = p.tree.max_blocks  # type: ignore[attr-defined]
    assert cap is not None
    hashes = list(range(cap + 500))
    _route(p, _ctx(hashes, *_cands(0), now=0.0))
    _route(p, _ctx([cap + 10_000], *_cands(0), now=60.0))  # trims before deciding
    assert p.tree.size(("m", "r0")) <= cap + 1  # type: ignore[attr-defined]
