"""MemoryPrefixIndex's lookup in C-level passes (``_runs``) against its block-by-block
walk (``_walk``), on index states that random sequences of writes, events, removals,
heartbeats and clock ticks make; and the per-replica entries equal to the per-block ones."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from cache_service import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IndexSettings,
    MemoryPrefixIndex,
)
from tests.cache_service.test_memory_index import FakeClock

HASHES = list(range(1, 41))  # one chain; prompts are its prefixes, and a few stray blocks
Op = tuple[str, str, int, int, str]  # kind, replica, first block, last block, tier

ops = st.lists(st.tuples(
    st.sampled_from(["routed", "stored", "removed", "cleared", "beat", "gone", "tick"]),
    st.sampled_from(["a", "b", "c"]), st.integers(0, 39), st.integers(0, 40),
    st.sampled_from(["device", "device", "host", "disk"])), max_size=40)


async def _apply(index: MemoryPrefixIndex, clock: FakeClock, op: Op) -> None:
    kind, replica, lo, hi, tier = op
    part = HASHES[lo:hi]
    if kind == "routed":
        await index.record_routed("m", replica, part)
    elif kind == "stored":
        await index.apply_events([BlockStored("m", replica, tuple(part), tier=tier)])
    elif kind == "removed":
        await index.apply_events([BlockRemoved("m", replica, tuple(part), tier=tier)])
    elif kind == "cleared":
        await index.apply_events([AllBlocksCleared("m", replica)])
    elif kind == "beat":
        await index.heartbeat("m", replica)
    elif kind == "gone":
        await index.remove_replica("m", replica)
    else:
        clock.now += lo / 4  # 0-10 s: past the routed TTL and the liveness TTL at times


def _by_replica(index: MemoryPrefixIndex) -> dict[tuple[str, str], dict[int, float]]:
    """The entries of ``_blocks``, keyed as ``_by_replica`` keeps them."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for (model, h), holders in index._blocks.items():
        for replica, expiry in holders.items():
            out.setdefault((model, replica), {})[h] = expiry
    return out


@settings(max_examples=300, deadline=None)
@given(ops=ops, probe=st.integers(0, 40))
def test_the_runs_agree_with_the_walk(ops: list[Op], probe: int) -> None:
    """Per replica, C-level: the same matches (host parts included) as the walk, on any
    index state; a run that ends at an expired entry is left to the walk."""

    async def scenario() -> None:
        clock = FakeClock()
        conf = IndexSettings(routed_ttl_s=4, stored_ttl_s=9, liveness_ttl_s=3,
                             memory_max_entries=60)  # tombstones last 9 s
        index = MemoryPrefixIndex(conf, clock=clock)
        for op in ops:
            await _apply(index, clock, op)
            assert index._by_replica == _by_replica(index)
            runs = index._runs("m", HASHES[:probe], clock.now)
            walk = index._walk("m", HASHES[:probe], clock.now)
            if runs is not None:
                assert runs == walk
                assert {r: m.host for r, m in runs.items()} == {
                    r: m.host for r, m in walk.items()}  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_dead_replicas_expired_entries_leave_lookups_on_the_fast_path() -> None:
    """The walk never reaches a dead replica's entries, so it would not delete its expired
    ones: were they checked before its liveness, every lookup would walk until a purge."""

    async def scenario() -> None:
        clock = FakeClock()
        index = MemoryPrefixIndex(IndexSettings(routed_ttl_s=4, stored_ttl_s=9,
                                                liveness_ttl_s=3), clock=clock)
        await index.record_routed("m", "a", HASHES[:4])
        await index.heartbeat("m", "a")
        await index.apply_events([BlockStored("m", "b", tuple(HASHES[:2]))])
        clock.now += 5  # a: heartbeat and entries expired
        assert index._runs("m", HASHES[:4], clock.now) == {"b": 2}
        assert (await index.lookup({"m": HASHES[:4]}))["m"] == {"b": 2}

    asyncio.run(scenario())
