"""Redis-only properties of RedisPrefixIndex: round trips, key layout, expiry mechanics,
script reloads and timeouts, against a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot

from cache_service import BlockRemoved, BlockStored, IndexSettings, RedisPrefixIndex, block_hashes

pytestmark = pytest.mark.asyncio(loop_scope="session")

SettingsFor = Callable[..., IndexSettings]
MODELS = ("llama", "qwen", "mistral")


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every packed write to a socket (one per round trip, pipelines included)."""
    calls: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, *args: object, **kwargs: object) -> None:
        calls.append(1)
        await original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return calls


@pytest.fixture
async def index(redis_url: str, settings_for: SettingsFor) -> AsyncIterator[RedisPrefixIndex]:
    idx = RedisPrefixIndex(redis_url, settings_for(), timeout_s=1.0)
    yield idx
    await idx.close()


def chains() -> dict[str, list[int]]:
    return {m: block_hashes(list(range(32_768)), salt=i) for i, m in enumerate(MODELS)}


async def fill_16_replicas(index: RedisPrefixIndex, hashes: dict[str, list[int]]) -> None:
    # replica i of each model holds the first 32 * (i + 1) blocks (the last one: all 512)
    events = [
        BlockStored(m, f"replica-{i:02d}", tuple(h[: 32 * (i + 1)]))
        for m, h in hashes.items()
        for i in range(16)
    ]
    await index.apply_events(events)


async def test_lookup_is_one_round_trip(
    index: RedisPrefixIndex, raw_redis: aioredis.Redis, sends: list[int]
) -> None:
    hashes = chains()
    await fill_16_replicas(index, hashes)
    await index.lookup(hashes)  # warm: connection + script load
    await raw_redis.config_resetstat()
    sends.clear()
    got = await index.lookup(hashes)
    assert len(sends) == 1, "lookup must be exactly one round trip"
    stats = await raw_redis.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert "cmdstat_eval" not in stats
    expected = {f"replica-{i:02d}": 32 * (i + 1) for i in range(16)}
    assert got == {m: expected for m in MODELS}


async def test_writes_are_one_round_trip(index: RedisPrefixIndex, sends: list[int]) -> None:
    hashes = chains()
    await index.record_routed("llama", "warm", hashes["llama"][:1])
    sends.clear()
    await index.record_routed("llama", "r1", hashes["llama"])
    assert len(sends) == 1
    sends.clear()
    await index.apply_events(
        [BlockStored(m, f"r{i}", tuple(h)) for m, h in hashes.items() for i in range(4)]
        + [BlockRemoved("llama", "r0", tuple(hashes["llama"][100:]))]
    )
    assert len(sends) == 1
    assert (await index.lookup({"llama": hashes["llama"]}))["llama"]["r0"] == 100


async def test_key_layout_single_slot_and_backstops(
    index: RedisPrefixIndex, raw_redis: aioredis.Redis, redis_url: str
) -> None:
    h = block_hashes(list(range(64 * 4)))
    await index.record_routed("llama", "r1", h)
    await index.apply_events([BlockStored("qwen", "r2", tuple(h))])
    await index.heartbeat("llama", "r1")
    await index.remove_replica("qwen", "r2")
    await index.record_routed("qwen", "r3", h[:1])
    keys = set([k async for k in raw_redis.scan_iter(match=index.prefix + "*")])
    assert len({key_slot(k.encode()) for k in keys}) == 1
    tag = index.tag("llama")
    assert keys == {
        f"{index.prefix}m",
        f"{index.prefix}r:{tag}:r1",
        f"{index.prefix}p:{tag}",
        f"{index.prefix}h:{tag}",
        f"{index.prefix}r:{index.tag('qwen')}:r3",  # r2's holdings were unlinked
        f"{index.prefix}p:{index.tag('qwen')}",
        f"{index.prefix}d:{index.tag('qwen')}",  # r2's tombstone
    }
    holdings = index.key("r", "llama", "r1")
    assert await raw_redis.type(holdings) == "hash"
    binary = aioredis.Redis.from_url(redis_url)  # no decoding: fields are binary
    fields = await binary.hgetall(holdings)  # 8-byte big-endian hash -> expiry ms
    await binary.aclose()
    assert sorted(fields) == sorted(x.to_bytes(8, "big") for x in h)
    assert all(abs(int(v) / 1000 - time.time() - 120) < 5 for v in fields.values())  # routed
    max_ms = index.settings.max_ttl_s * 1000
    for key in keys:
        if key[len(index.prefix)] in "rp":  # data keys carry an expiry backstop
            assert 0 < await raw_redis.pttl(key) <= max_ms


async def test_lookup_stops_early(index: RedisPrefixIndex, raw_redis: aioredis.Redis) -> None:
    h = block_hashes(list(range(64 * 512)))
    await index.apply_events([BlockStored("m", f"r{i}", tuple(h[:i])) for i in range(1, 9)])
    await index.apply_events([BlockStored("m", "full", tuple(h))])
    await index.lookup({"m": h})
    await raw_redis.config_resetstat()
    assert await index.lookup({"m": [1] + h[1:]}) == {"m": {}}
    stats = await raw_redis.info("commandstats")
    assert stats["cmdstat_hget"]["calls"] == 9  # one single-field probe per holder
    assert "cmdstat_hmget" not in stats
    await raw_redis.config_resetstat()
    got = await index.lookup({"m": h})
    assert got == {"m": {"full": 512, **{f"r{i}": i for i in range(1, 9)}}}
    stats = await raw_redis.info("commandstats")
    assert stats["cmdstat_hmget"]["calls"] == 9  # blocks 2..8 of each holder of block 1
    # block 1 each, then log2(512 - 8) probes for "full" and "r8" (past the exact head)
    assert stats["cmdstat_hget"]["calls"] <= 9 + 2 * 9


async def test_binary_search_finds_every_depth(
    index: RedisPrefixIndex, raw_redis: aioredis.Redis
) -> None:
    """Prefix-closed holdings (the normal case): the match is exact at every depth."""
    h = block_hashes(list(range(64 * 600)), salt=5)
    depths = [1, 2, 7, 8, 9, 10, 31, 32, 33, 100, 255, 256, 257, 511, 512, 513, 599, 600]
    await index.apply_events([BlockStored("m", f"d{d}", tuple(h[:d])) for d in depths])
    for n in (1, 8, 9, 300, 512, 600):
        expected = {f"d{d}": min(d, n) for d in depths}
        assert (await index.lookup({"m": h[:n]}))["m"] == expected
    diverged = h[:200] + list(range(7, 407))  # the prompt diverges: later hashes all differ
    assert (await index.lookup({"m": diverged}))["m"] == {f"d{d}": min(d, 200) for d in depths}
    await raw_redis.config_resetstat()
    await index.lookup({"m": h})
    hget = (await raw_redis.info("commandstats"))["cmdstat_hget"]["calls"]
    assert hget <= len(depths) * (1 + 10)  # block 1 + log2(600 - 8) probes per replica


async def test_hole_beyond_exact_prefix_is_approximate(index: RedisPrefixIndex) -> None:
    """Holes in the first EXACT_BLOCKS are exact; a deeper hole may be jumped over: the match
    is then some held -> missing boundary, never less than the exact one (module docstring)."""
    h = block_hashes(list(range(64 * 300)), salt=6)
    await index.apply_events(
        [
            BlockStored("m", "early", tuple(h[:5] + h[6:])),  # hole at block 5: exact
            BlockStored("m", "deep", tuple(h[:100] + h[101:])),  # hole at block 100
        ]
    )
    got = (await index.lookup({"m": h}))["m"]
    assert got["early"] == 5
    assert got["deep"] in (100, 300)


async def test_reply_survives_odd_replica_names(index: RedisPrefixIndex) -> None:
    """The lookup reply is JSON built by cjson: names must round-trip whatever they contain."""
    h = block_hashes(list(range(64 * 20)), salt=8)
    names = ['q"uote\\back/slash', "1", "2", "ünï 🚀", "tab\tnl\n", "[]{}:,"]
    await index.apply_events([BlockStored("m", r, tuple(h[: i + 1])) for i, r in enumerate(names)])
    assert (await index.lookup({"m": h, "x": h}))["m"] == {r: i + 1 for i, r in enumerate(names)}


async def test_expired_entries_deleted_lazily(redis_url: str, settings_for: SettingsFor) -> None:
    index = RedisPrefixIndex(redis_url, settings_for(routed_ttl_s=0.2), timeout_s=1.0)
    client = index.client
    h = block_hashes(list(range(64 * 3)))
    await index.apply_events([BlockStored("m", "r1", tuple(h[:1]))])
    await index.record_routed("m", "r1", h)
    holdings = index.key("r", "m", "r1")
    assert await client.hlen(holdings) == 3
    await asyncio.sleep(0.35)
    assert (await index.lookup({"m": h}))["m"] == {"r1": 1}
    assert (await index.stats()).blocks == 3  # expired, not swept yet
    await index.record_routed("m", "r1", h[2:])  # any write sweeps expired fields
    assert await client.hlen(holdings) == 2
    await index.close()


async def test_sweep_cursor_cleans_big_holdings(redis_url: str, settings_for: SettingsFor) -> None:
    # The fresh writes below must all land within one TTL: 2 s leaves room on a busy machine
    # (0.2 s did not: the first fresh fields expired and were swept before the count).
    index = RedisPrefixIndex(redis_url, settings_for(routed_ttl_s=2.0), timeout_s=1.0)
    client = index.client
    old = block_hashes(list(range(64 * 3000)), salt=1)  # hashtable-encoded HASH
    await index.record_routed("m", "r1", old)
    await asyncio.sleep(2.1)
    fresh = block_hashes(list(range(64 * 100)), salt=2)
    for i in range(100):  # each write sweeps 2 * 1 new + 64 fields from the saved cursor
        await index.record_routed("m", "r1", fresh[i : i + 1])
        if i == 3:
            assert await client.hexists(index.key("c", "m"), "r1")  # sweep in progress
    assert await client.hlen(index.key("r", "m", "r1")) == 100
    await index.close()


async def test_script_reloaded_after_flush(
    index: RedisPrefixIndex, raw_redis: aioredis.Redis
) -> None:
    h = block_hashes(list(range(128)))
    await index.record_routed("m", "r1", h)
    await raw_redis.script_flush()  # what a Redis restart does to the script cache
    assert (await index.lookup({"m": h}))["m"] == {"r1": 2}
    await raw_redis.script_flush()
    await index.record_routed("m", "r2", h[:1])
    assert (await index.lookup({"m": h}))["m"] == {"r1": 2, "r2": 1}


async def test_times_out_fast_on_unresponsive_server() -> None:
    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 20)  # accept and never answer
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    index = RedisPrefixIndex(f"redis://127.0.0.1:{port}/0", IndexSettings(), timeout_s=0.05)
    start = time.perf_counter()
    with pytest.raises((aioredis.TimeoutError, TimeoutError, aioredis.ConnectionError)):
        await index.lookup({"m": [1, 2, 3]})
    assert time.perf_counter() - start < 3.0  # the 50 ms timeout, not the server's 5 s
    await index.close()
    server.close()


async def test_raises_when_nothing_listens(unused_tcp_port: int) -> None:
    index = RedisPrefixIndex(f"redis://127.0.0.1:{unused_tcp_port}/0", timeout_s=0.05)
    with pytest.raises(aioredis.ConnectionError):
        await index.record_routed("m", "r", [1])
    await index.close()


async def test_memory_per_block(
    index: RedisPrefixIndex, raw_redis: aioredis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes per (block, replica) entry; printed with -s (see ops/bench/index.py)."""
    n = 20_000
    h = block_hashes(list(range(64 * n)), salt=7)
    before = (await raw_redis.info("memory"))["used_memory"]
    await index.apply_events([BlockStored("m", "SERVE_REPLICA::kvroute#LLM#a1b2c3", tuple(h))])
    per_entry = ((await raw_redis.info("memory"))["used_memory"] - before) / n
    with capsys.disabled():
        print(f"\nredis bytes per cached (block, replica) entry: {per_entry:.0f}")
    assert per_entry < 200


async def test_sessions_are_shared_and_stored_as_digests(
    redis_url: str, raw_redis: Any, settings_for: Any
) -> None:
    settings = settings_for()
    router_a = RedisPrefixIndex(redis_url, settings, timeout_s=1.0)
    router_b = RedisPrefixIndex(redis_url, settings, timeout_s=1.0)  # another router replica
    await router_a.record_session("alice@example.com", "m", "r3")
    assert await router_b.session("alice@example.com") == ("m", "r3")
    keys = [k async for k in raw_redis.scan_iter(router_a.prefix + "s:*")]
    assert len(keys) == 1 and "alice" not in keys[0]
    assert 0 < await raw_redis.pttl(keys[0]) <= settings.session_ttl_s * 1000
    await router_a.close()
    await router_b.close()


async def test_held_blocks_lists_a_replicas_unexpired_blocks(
    redis_url: str, settings_for: SettingsFor
) -> None:
    idx = RedisPrefixIndex(redis_url, settings_for(routed_ttl_s=0.2), timeout_s=1.0)
    try:
        big = [2**64 - 1, 1 << 63, 12345]  # full 64-bit hashes round-trip
        await idx.apply_events([BlockStored("llama", "r1", tuple(big))])
        await idx.record_routed("llama", "r1", [777])  # routed: expires in 0.2 s
        await idx.apply_events([BlockStored("llama", "r2", (1, 2))])
        assert await idx.held_blocks("llama", "r1") == {*big, 777}
        assert await idx.held_blocks("llama", "r2") == {1, 2}
        assert await idx.held_blocks("llama", "gone") == set()
        await asyncio.sleep(0.3)
        assert await idx.held_blocks("llama", "r1") == set(big)
    finally:
        await idx.close()
