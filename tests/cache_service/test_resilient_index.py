"""ResilientIndex against a redis-server we SIGKILL and restart: no exceptions, answers from
the local fallback, errors counted, no per-request latency while down, automatic recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache_service import (
    BlockRemoved,
    BlockStored,
    IndexSettings,
    MemoryPrefixIndex,
    PrefixIndex,
    RedisPrefixIndex,
    ResilientIndex,
    block_hashes,
    make_index,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

SettingsFor = Callable[..., IndexSettings]
WaitFor = Callable[..., Awaitable[None]]
H = block_hashes(list(range(64 * 6)))
H2 = block_hashes(list(range(1, 64 * 6 + 1)))


def resilient(url: str, settings: IndexSettings, timeout_s: float = 0.5
              ) -> tuple[ResilientIndex, list[str]]:
    """A ResilientIndex over Redis at ``url`` (a fast backoff) and its failed ops. The Redis
    timeout is generous (a dead Redis refuses at once; a loaded machine makes 50 ms calls
    time out); the hung-server test sets the production 50 ms."""
    errors: list[str] = []
    primary = RedisPrefixIndex(url, settings, timeout_s=timeout_s)
    index = ResilientIndex(primary, MemoryPrefixIndex(settings), errors.append, backoff_s=0.3)
    return index, errors


async def traffic(index: ResilientIndex, stop: asyncio.Event) -> int:
    """Router-like load: lookups, routed writes, events, heartbeats. Returns calls made."""
    calls = 0
    while not stop.is_set():
        await index.lookup({"m": H, "m2": H2})
        await index.record_routed("m", "r1", H[:3])
        await index.apply_events([BlockStored("m2", "r2", tuple(H2[:2]))])
        await index.heartbeat("m", "r1")
        calls += 4
        await asyncio.sleep(0.002)
    return calls


async def test_survives_kill_and_recovers_after_restart(
    own_redis: Any, settings_for: SettingsFor, wait_for: WaitFor
) -> None:
    index, errors = resilient(own_redis.url, settings_for())
    raw = aioredis.Redis.from_url(own_redis.url, decode_responses=True)
    await index.apply_events([BlockStored("m", "r1", tuple(H))])
    assert await index.lookup({"m": H}) == {"m": {"r1": 6}}
    assert index.primary_healthy and errors == [] and await raw.dbsize() > 0

    stop = asyncio.Event()
    load = asyncio.create_task(traffic(index, stop))
    await asyncio.sleep(0.1)
    await own_redis.kill()  # while calls are in flight
    await asyncio.sleep(0.5)
    assert not index.primary_healthy and errors
    # down: answers come from the local view, which got every write
    assert await index.lookup({"m": H}) == {"m": {"r1": 6}}
    await index.record_routed("m", "r9", H[:2])
    assert (await index.lookup({"m": H}))["m"] == {"r1": 6, "r9": 2}

    await own_redis.start()  # same port, empty (no persistence)
    await wait_for(lambda: _healthy_and_filled(index, raw), within_s=5.0)
    stop.set()
    assert await load > 0  # the load task never raised
    assert set(errors) <= {"lookup", "record_routed", "apply_events", "heartbeat"}
    # served by the restarted primary: it only has writes made since the restart
    assert await index.lookup({"m": H}) == {"m": {"r1": 3}}
    assert (await index.stats()).backend == "resilient(redis)"
    await index.close()
    await raw.aclose()


async def _healthy_and_filled(index: ResilientIndex, raw: aioredis.Redis) -> bool:
    try:
        return index.primary_healthy and await raw.dbsize() > 0
    except (aioredis.ConnectionError, OSError):
        return False


async def test_dead_redis_adds_no_latency(own_redis: Any, settings_for: SettingsFor) -> None:
    index, errors = resilient(own_redis.url, settings_for())
    await index.record_routed("m", "r1", H)
    await own_redis.kill()
    await index.lookup({"m": H})  # first failure opens the circuit
    count = len(errors)
    assert count >= 1
    for _ in range(200):
        assert await index.lookup({"m": H}) == {"m": {"r1": 6}}
        await index.record_routed("m", "r1", H)
    assert len(errors) == count  # no primary attempts within the backoff
    await asyncio.sleep(0.35)  # backoff over: exactly one probe, even with concurrent calls
    results = await asyncio.gather(*(index.lookup({"m": H}) for _ in range(20)))
    assert all(r == {"m": {"r1": 6}} for r in results)
    assert len(errors) == count + 1
    await index.close()


async def test_hung_redis_is_cut_by_timeouts(settings_for: SettingsFor) -> None:
    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 20)
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    index, errors = resilient(url, settings_for(), timeout_s=0.05)
    start = time.perf_counter()
    await index.record_routed("m", "r1", H)
    assert await index.lookup({"m": H}) == {"m": {"r1": 6}}
    await index.heartbeat("m", "r1")
    assert await index.live_replicas("m") == {"r1"}
    # cut by the 50 ms timeouts, not left to the server's 5 s (slack for a loaded machine)
    assert time.perf_counter() - start < 3.0
    assert errors == ["record_routed"]
    await index.close()
    server.close()


async def test_all_calls_safe_without_redis(
    unused_tcp_port: int, settings_for: SettingsFor
) -> None:
    calls: list[str] = []
    index = make_index(f"redis://127.0.0.1:{unused_tcp_port}/0", settings_for(), calls.append)
    assert isinstance(index, ResilientIndex) and isinstance(index, PrefixIndex)
    await index.heartbeat("m", "r1")
    await index.record_routed("m", "r1", H)
    await index.apply_events([BlockStored("m", "r2", tuple(H[:1]))])
    assert await index.lookup({"m": H}) == {"m": {"r1": 6, "r2": 1}}
    assert await index.live_replicas("m") == {"r1", "r2"}
    await index.remove_replica("m", "r2")
    assert await index.purge_dead() == 0
    stats = await index.stats()
    assert (stats.blocks, stats.replicas, stats.backend) == (6, 1, "resilient(memory-fallback)")
    assert calls == ["heartbeat"]  # then the circuit stayed open: no further attempts
    await index.close()


async def test_on_error_callback_failure_is_contained(
    unused_tcp_port: int, settings_for: SettingsFor
) -> None:
    def broken(op: str) -> None:
        raise RuntimeError("metrics down")

    primary = RedisPrefixIndex(f"redis://127.0.0.1:{unused_tcp_port}/0", timeout_s=0.05)
    index = ResilientIndex(primary, MemoryPrefixIndex(settings_for()), broken)
    assert await index.lookup({"m": H}) == {"m": {}}
    assert index.errors["lookup"] == 1
    await index.close()


async def test_make_index_without_url_is_memory() -> None:
    assert isinstance(make_index(None, IndexSettings()), MemoryPrefixIndex)
    assert isinstance(make_index("", IndexSettings()), MemoryPrefixIndex)


async def test_removal_missed_while_down_lands_after_recovery(
    own_redis: Any, settings_for: SettingsFor, wait_for: WaitFor
) -> None:
    index, errors = resilient(own_redis.url, settings_for())
    await own_redis.kill()
    await index.remove_replica("m", "r2")  # the router saw r2 die; Redis cannot hear it
    assert "remove_replica" in errors
    await own_redis.start()
    await wait_for(lambda: _probe_healthy(index), within_s=5.0)
    # a late write (an in-flight routed request) makes r2 look live in the restarted primary
    await index.primary.record_routed("m", "r2", H)
    assert await index.primary.live_replicas("m") == {"r2"}
    await index.stats()  # the router's periodic maintenance call settles the owed tombstone
    assert await index.primary.live_replicas("m") == set()
    await index.close()


async def _probe_healthy(index: ResilientIndex) -> bool:
    await index.lookup({"m": H})
    return index.primary_healthy



async def test_sessions_fall_back_to_the_local_view(
    own_redis: Any, settings_for: SettingsFor
) -> None:
    index, errors = resilient(own_redis.url, settings_for())
    await index.record_session("s", "m", "r1")
    assert await index.primary.session("s") == ("m", "r1")  # shared while Redis is up
    await own_redis.kill()
    await index.record_session("s", "m", "r2")
    assert await index.session("s") == ("m", "r2")  # this router's own view, no exception
    assert "record_session" in errors
    await index.close()


async def test_events_missed_while_down_are_replayed_in_order(
    own_redis: Any, settings_for: SettingsFor, wait_for: WaitFor
) -> None:
    index, errors = resilient(own_redis.url, settings_for())
    await own_redis.kill()
    await index.apply_events([BlockStored("m", "r1", tuple(H))])  # the worker's Redis blinked
    await index.apply_events([BlockRemoved("m", "r1", tuple(H[4:]))])
    assert "apply_events" in errors
    await own_redis.start()
    await asyncio.sleep(0.35)  # the circuit's backoff
    await wait_for(lambda: _replayed(index), within_s=5.0)  # the periodic heartbeat sends them
    assert await index.primary.lookup({"m": H}) == {"m": {"r1": 4}}  # stored, then removed
    await index.close()


async def _replayed(index: ResilientIndex) -> bool:
    await index.heartbeat("m", "r1")
    return not index._owed_events  # noqa: SLF001
