"""MemoryPrefixIndex specifics: injected clock, bounded memory (LRU cap, lazy sweeps)."""

from __future__ import annotations

import pytest

from cache_service import BlockStored, IndexSettings, MemoryPrefixIndex, block_hashes

pytestmark = pytest.mark.asyncio(loop_scope="session")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_clock_drives_ttls_and_liveness() -> None:
    clock = FakeClock()
    settings = IndexSettings(routed_ttl_s=10, stored_ttl_s=100, liveness_ttl_s=5)
    index = MemoryPrefixIndex(settings, clock=clock)
    h = block_hashes(list(range(64 * 4)))
    await index.record_routed("m", "a", h)
    await index.apply_events([BlockStored("m", "b", tuple(h[:2]))])
    await index.heartbeat("m", "b")
    clock.now += 9.9
    assert (await index.lookup({"m": h}))["m"] == {"a": 4}  # b's heartbeat expired at +5
    await index.heartbeat("m", "b")
    clock.now += 0.2
    assert (await index.lookup({"m": h}))["m"] == {"b": 2}  # a's routed entries expired
    clock.now += 100
    assert (await index.lookup({"m": h}))["m"] == {}
    assert await index.purge_dead() == 1  # b: entries purged
    # lookups deleted the expired entries they walked over; a's block 3 awaits a sweep
    assert (await index.stats()).blocks == 1


async def test_lru_cap_bounds_entries() -> None:
    index = MemoryPrefixIndex(IndexSettings(memory_max_entries=1000))
    for i in range(20):
        await index.record_routed("m", "a", block_hashes(list(range(64 * 100)), salt=i))
        assert (await index.stats()).blocks <= 1000
    newest = block_hashes(list(range(64 * 100)), salt=19)
    oldest = block_hashes(list(range(64 * 100)), salt=0)
    assert (await index.lookup({"m": newest}))["m"] == {"a": 100}
    assert (await index.lookup({"m": oldest}))["m"] == {}
    assert len(index._by_replica[("m", "a")]) == (await index.stats()).blocks


async def test_expired_entries_swept_by_writes() -> None:
    clock = FakeClock()
    index = MemoryPrefixIndex(IndexSettings(routed_ttl_s=1), clock=clock)
    for i in range(50):
        await index.record_routed("m", f"r{i}", block_hashes(list(range(64)), salt=i))
    clock.now += 2
    for i in range(50):  # each write sweeps expired blocks off the LRU head
        await index.record_routed("m", "fresh", block_hashes(list(range(64)), salt=100 + i))
    assert (await index.stats()).blocks == 50
    assert await index.live_replicas("m") == {"fresh"}


async def test_rejects_unknown_event() -> None:
    index = MemoryPrefixIndex()
    with pytest.raises(TypeError):
        await index.apply_events(["nope"])  # type: ignore[list-item]


async def test_a_long_routed_write_lets_the_loop_run_between_steps() -> None:
    """2,000 blocks (a 128k-token prompt) go in steps: another task runs, and a lookup made
    meanwhile sees a leading run of them; once done, all of them."""
    import asyncio

    index = MemoryPrefixIndex()
    h = block_hashes(list(range(64 * 2000)))
    seen: list[dict[str, int]] = []

    async def meanwhile() -> None:
        await asyncio.sleep(0)
        seen.append((await index.lookup({"m": h}))["m"])

    other = asyncio.create_task(meanwhile())
    await index.record_routed("m", "a", h)
    await other
    assert seen and 0 < seen[0]["a"] < 2000
    assert (await index.lookup({"m": h}))["m"] == {"a": 2000}
