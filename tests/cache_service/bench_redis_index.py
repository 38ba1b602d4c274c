"""Measure the Redis prefix index: lookup latency of a 32k-token prompt (512 blocks of 64)
against a filled 16-replica index, compared with PING, and memory per cached block.

    . .venv/bin/activate && python tests/cache_service/bench_redis_index.py

Starts its own redis-server (loopback, free port, no persistence). Not a test (no test_ prefix).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import port_for
import redis.asyncio as aioredis

from cache_service import BlockStored, IndexSettings, RedisPrefixIndex, block_hashes, model_salt

REPLICAS = [f"SERVE_REPLICA::kvroute#LLM#{i:06x}" for i in range(16)]  # realistic name length
SALT = model_salt("meta-llama/Llama-3.1-8B-Instruct")


async def timed(fn: Callable[[], Awaitable[object]], n: int = 2000) -> tuple[float, float]:
    for _ in range(50):
        await fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(0.99 * n)] * 1e6


async def fill(index: RedisPrefixIndex, prompts: int) -> None:
    for p in range(prompts):  # background: distinct 32k prompts spread over replicas
        h = block_hashes(list(range(p * 40_000, p * 40_000 + 32_768)), salt=SALT)
        await index.apply_events([BlockStored("llama", REPLICAS[p % 16], tuple(h))])


async def memory(raw: aioredis.Redis, index: RedisPrefixIndex) -> None:
    n = 50_000
    h = block_hashes(list(range(10**7, 10**7 + 64 * n)), salt=SALT)
    used = [(await raw.info("memory"))["used_memory"]]
    for replica in REPLICAS[:4]:
        await index.apply_events([BlockStored("mem", replica, tuple(h))])
        used.append((await raw.info("memory"))["used_memory"])
    first = (used[1] - used[0]) / n
    extra = (used[4] - used[1]) / (3 * n)
    print(
        f"memory (INFO used_memory): {first:.0f} B/entry for 1 replica, {extra:.0f} B per extra "
        f"replica; 1M entries = {first * 1e6 / 2**20:.0f} MiB"
    )
    usage = await raw.memory_usage(index.key("r", "mem", REPLICAS[0]), samples=0)
    print(f"MEMORY USAGE of one {n}-entry holdings HASH: {usage} B = {usage / n:.0f} B/entry")


async def main() -> None:
    port = port_for.select_random()
    workdir = tempfile.mkdtemp()
    proc = await asyncio.create_subprocess_exec(
        shutil.which("redis-server") or "/usr/bin/redis-server",
        *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir),
        stdout=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(0.3)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        index = RedisPrefixIndex(url, IndexSettings(namespace="bench"), timeout_s=1.0)
        raw = aioredis.Redis.from_url(url)
        await fill(index, 160)
        target = block_hashes(list(range(32_768)), salt=SALT)
        for i, replica in enumerate(REPLICAS):  # replica i holds the first 32 * (i + 1) blocks
            await index.apply_events([BlockStored("llama", replica, tuple(target[: 32 * (i + 1)]))])
        info = await raw.info("keyspace")
        print(f"index: {info}  (16 replicas, 160 background 32k prompts + target)")
        ping = await timed(raw.ping)
        await raw.config_resetstat()
        look = await timed(lambda: index.lookup({"llama": target}))
        server_us = (await raw.info("commandstats"))["cmdstat_evalsha"]["usec_per_call"]
        two = block_hashes(list(range(1, 32_769)), salt=SALT)  # typical: 2 replicas hold it
        await index.apply_events([BlockStored("llama", REPLICAS[0], tuple(two))])
        await index.apply_events([BlockStored("llama", REPLICAS[1], tuple(two[:256]))])
        typical = await timed(lambda: index.lookup({"llama": two}))
        miss = await timed(lambda: index.lookup({"llama": [1] + target[1:]}))
        full = await timed(lambda: index.lookup({"llama": block_hashes(range(32_768), salt=SALT)}))
        three = await timed(lambda: index.lookup({"llama": target, "a": target, "b": target}))
        route = await timed(lambda: index.record_routed("llama", REPLICAS[3], target))
        for name, (p50, p99) in [
            ("PING", ping),
            ("lookup 512 blocks, 16 replicas", look),
            ("lookup 512 blocks, 2 of 16 match", typical),
            ("lookup miss", miss),
            ("hash 32k tokens + lookup", full),
            ("lookup 3 models (2 unknown)", three),
            ("record_routed 512", route),
        ]:
            print(f"{name:34s} p50 {p50:7.0f} us   p99 {p99:7.0f} us")
        print(f"server-side time of the 16-replica lookup script: {server_us:.0f} us")
        await memory(raw, index)
        await index.close()
        await raw.aclose()
    finally:
        proc.kill()
        await proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
