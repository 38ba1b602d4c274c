"""The sim emulator's second KV tier and leases (``workers.sim_kv``), in virtual time."""

from __future__ import annotations

import pytest

from cache_service.events import BlockRemoved, BlockStored, CacheEvent
from cache_service.index import IndexSettings
from cache_service.memory_index import MemoryPrefixIndex
from tests.workers.test_sim_engine import drain, first_token_times
from workers.sim_core import SimCore, SimFinish, SimParams, SimRequest


def by_tier(events: list[CacheEvent]) -> list[tuple[str, str, tuple[int, ...]]]:
    out = []
    for e in events:
        if isinstance(e, BlockStored | BlockRemoved):
            out.append((type(e).__name__, e.tier, e.hashes))
    return out


def finish_of(outs: list, rid: str) -> SimFinish:
    return next(o for o in outs if isinstance(o, SimFinish) and o.request_id == rid)


def test_evicted_blocks_move_to_host_and_reload_at_its_rate() -> None:
    p = SimParams(kv_blocks=4, block_size=10, prefill_tok_s=1000.0, tpot_s=0.01,
                  host_kv_blocks=3, host_reload_tok_s=10000.0)
    core = SimCore(p, "m", "r")
    core.submit(SimRequest("a", [1, 2, 3], 31, 1), 0.0)
    drain(core)
    core.submit(SimRequest("b", [10, 11, 12], 31, 1), 1.0)
    drain(core)
    assert by_tier(core.drain_events()) == [
        ("BlockStored", "device", (1, 2, 3)),
        ("BlockStored", "host", (3, 2)),  # the deepest first, to host ...
        ("BlockRemoved", "device", (3, 2)),  # ... then off the device
        ("BlockStored", "device", (10, 11, 12)),
    ]
    # "a" again: block 1 on device, 2 and 3 reloaded from host (20 tokens at 10k tok/s),
    # 1 token computed (at least one is): TTFT = 0.001 + 0.002.
    core.submit(SimRequest("a2", [1, 2, 3], 31, 1), 2.0)
    outs = drain(core)
    assert first_token_times(outs)["a2"] - 2.0 == pytest.approx(0.003, abs=1e-3)
    fin = finish_of(outs, "a2")
    assert (fin.cached_tokens, fin.host_cached_tokens) == (30, 20)
    events = by_tier(core.drain_events())
    assert events[-2:] == [("BlockStored", "device", (2, 3)), ("BlockRemoved", "host", (2, 3))]
    assert core.load().reload_cost == pytest.approx(0.1)
    assert core.load().routing_stats()["reload_cost"] == pytest.approx(0.1)


async def test_index_follows_the_tiers_exactly() -> None:
    """Every event applied in order: the index's view equals the core's, tier by tier."""
    p = SimParams(kv_blocks=6, block_size=4, prefill_tok_s=1e6, tpot_s=0.01,
                  host_kv_blocks=5, host_reload_tok_s=1e7)
    core = SimCore(p, "m", "r")
    index = MemoryPrefixIndex(IndexSettings())
    prompts = [[i * 10 + j for j in range(3)] for i in range(6)] * 2
    for n, hashes in enumerate(prompts):
        core.submit(SimRequest(f"q{n}", hashes, 12, 1), float(n))
        drain(core)
        await index.apply_events(core.drain_events())
        for probe in prompts[:6]:
            got = (await index.lookup({"m": probe}))["m"].get("r", 0)
            hit, host = core.kv.prefix(probe)
            assert (got, getattr(got, "host", 0)) == (hit, host), (n, probe)
    assert (await index.stats()).blocks == core.kv.cached + len(core.kv.host)


def test_no_host_tier_is_the_single_tier_model() -> None:
    core = SimCore(SimParams(kv_blocks=2, block_size=4, prefill_tok_s=1e6), "m", "r")
    core.submit(SimRequest("a", [1, 2], 8, 1), 0.0)
    core.submit(SimRequest("b", [3, 4], 8, 1), 1.0)
    drain(core)
    assert by_tier(core.drain_events())[1] == ("BlockRemoved", "device", (2, 1))
    assert "reload_cost" not in core.load().routing_stats()
