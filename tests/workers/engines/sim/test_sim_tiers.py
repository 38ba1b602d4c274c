"""The sim emulator's second KV tier and leases (``workers.engines.sim.kv``), in virtual time."""

from __future__ import annotations

import pytest

from cache_service.events import BlockRemoved, BlockStored, CacheEvent
from cache_service.index import IndexSettings
from cache_service.memory_index import MemoryPrefixIndex
from tests.workers.engines.sim.test_sim_engine import drain, first_token_times
from workers.engines.sim.core import SimCore, SimFinish, SimParams, SimRequest


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


def test_leased_blocks_go_after_unleased_ones_and_leases_expire() -> None:
    p = SimParams(kv_blocks=6, block_size=4, prefill_tok_s=1e6, tpot_s=0.01, lease_fraction=0.5)
    core = SimCore(p, "m", "r")
    core.submit(SimRequest("kept", [1, 2, 3], 12, 1, lease_s=10.0), 0.0)
    core.submit(SimRequest("other", [4, 5, 6], 12, 1), 0.0)
    drain(core)
    core.drain_events()
    core.submit(SimRequest("new", [7, 8, 9], 12, 1), 1.0)  # needs 3 slots: "other" goes
    drain(core)
    assert by_tier(core.drain_events())[0] == ("BlockRemoved", "device", (6, 5, 4))
    assert core.cached_prefix_blocks(SimRequest("q", [1, 2, 3], 12, 1)) == 3
    # Only leased blocks left to evict: they go then, deepest first.
    core.submit(SimRequest("more", [20], 4, 1), 2.0)
    drain(core)
    assert by_tier(core.drain_events())[0] == ("BlockRemoved", "device", (9,))
    core.submit(SimRequest("more2", [21, 22, 23, 24], 16, 1), 3.0)
    drain(core)
    assert removed_of(core.drain_events()) == [8, 7, 20, 3]
    # A block keeps the latest of its leases; an expired lease is an ordinary block again,
    # and the least recently used one.
    core.submit(SimRequest("k2", [1, 2], 8, 1, lease_s=1.0), 4.0)
    drain(core)
    core.submit(SimRequest("x", [30, 31], 8, 1), 9.0)  # lease of 1, 2 still runs (to 10)
    drain(core)
    assert removed_of(core.drain_events()) == [24, 23]
    core.submit(SimRequest("y", [40, 41], 8, 1), 11.0)
    drain(core)
    assert removed_of(core.drain_events()) == [2, 1]


def test_leases_hold_at_most_their_fraction_leading_blocks_first() -> None:
    """Full leases refuse newcomers (a stable warm subset; rotating would thrash like LRU);
    a prompt that only partly fits leases its leading blocks."""
    p = SimParams(kv_blocks=8, block_size=4, prefill_tok_s=1e6, tpot_s=0.01, lease_fraction=0.375)
    core = SimCore(p, "m", "r")
    core.submit(SimRequest("a", [1, 2], 8, 1, lease_s=100.0), 0.0)
    drain(core)
    core.submit(SimRequest("b", [3, 4], 8, 1, lease_s=100.0), 1.0)  # room for one more: 3
    drain(core)
    assert set(core.kv.leased) == {1, 2, 3}
    core.submit(SimRequest("c", [5, 6, 7, 8, 9], 20, 1), 2.0)  # needs one slot more
    drain(core)
    assert removed_of(core.drain_events()) == [4]  # the unleased block goes
    core.submit(SimRequest("d", [11, 12, 13], 12, 1), 3.0)  # unleased LRU first: c's tail
    drain(core)
    assert removed_of(core.drain_events()) == [9, 8, 7]
    assert set(core.kv.leased) == {1, 2, 3}


def removed_of(events: list[CacheEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.hashes]


def test_lease_counts_say_what_became_of_leased_blocks() -> None:
    """Granted, refused by the cap, hit by the next turn, expired unused, evicted early."""
    p = SimParams(kv_blocks=6, block_size=4, prefill_tok_s=1e6, tpot_s=0.01, lease_fraction=0.5)
    core = SimCore(p, "m", "r")
    counts = core.kv.lease_counts
    core.submit(SimRequest("a", [1, 2], 8, 1, lease_s=10.0), 0.0)
    core.submit(SimRequest("b", [3, 4], 8, 1, lease_s=10.0), 0.0)
    drain(core)
    assert (counts.granted, counts.refused) == (3, 1)  # the cap is 3 blocks: 4 is left out
    core.submit(SimRequest("a2", [1, 2, 5], 12, 1, lease_s=10.0), 1.0)
    drain(core)
    assert counts.hit == 2  # 1 and 2 were leased; 5 is new and fits no more
    assert (counts.granted, counts.refused) == (5, 2)
    core.submit(SimRequest("c", [6, 7, 8, 9], 16, 1), 2.0)  # unleased 4, 5 go, then 3
    drain(core)
    assert (counts.evicted, counts.expired) == (1, 0)
    core.submit(SimRequest("d", [10, 11], 8, 1), 30.0)  # 1 and 2 ran out unused
    drain(core)
    assert (counts.expired, counts.evicted, counts.hit) == (2, 1, 2)


def test_an_expired_lease_frees_its_room_in_the_cap_without_an_eviction() -> None:
    """Leases that ran out no longer count against ``lease_fraction``, also while the cache
    has room (no eviction runs): else they refuse new leases for nothing."""
    p = SimParams(kv_blocks=20, block_size=4, prefill_tok_s=1e6, tpot_s=0.01, lease_fraction=0.15)
    core = SimCore(p, "m", "r")
    core.submit(SimRequest("a", [1, 2, 3], 12, 1, lease_s=5.0), 0.0)
    drain(core)
    assert set(core.kv.leased) == {1, 2, 3}  # the cap: 3 blocks
    core.submit(SimRequest("b", [4, 5], 8, 1, lease_s=5.0), 30.0)  # a's lease ran out at 5
    drain(core)
    assert set(core.kv.leased) == {4, 5}
    assert core.kv.lease_counts.refused == 0
