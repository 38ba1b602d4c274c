"""The embedded prefix index's cost per request, in process: ``MemoryPrefixIndex.lookup``
and ``record_routed`` (what a router with no Redis pays on every request) for prompts of
N blocks, with four replicas holding 1, 1/2, 1/3 and 1/4 of the prompt.

    kvroute bench micro index-cost [BLOCKS ...]    # default 940 2400 10000

940 blocks is the agent bench's ~15k-token prompt at 16 tokens per block; 10,000 is a
160k-token session. Process CPU ms per call, the median of 9 rounds of 50 calls.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Awaitable, Callable

from cache_service import MemoryPrefixIndex
from ops.bench.harness.micro import median_cpu_s_async

REPLICAS = ("r0", "r1", "r2", "r3")


async def _ms_per_call(call: Callable[[], Awaitable[object]]) -> float:
    return 1e3 * await median_cpu_s_async(call, runs=9, per_run=50)


async def measure(blocks: int) -> tuple[float, float]:
    """(lookup ms, record_routed ms) for a prompt of ``blocks`` blocks."""
    index = MemoryPrefixIndex()
    rng = random.Random(blocks)
    hashes = [rng.getrandbits(63) for _ in range(blocks)]
    for k, replica in enumerate(REPLICAS):
        await index.record_routed("m", replica, hashes[:blocks // (k + 1)])
    lookup = await _ms_per_call(lambda: index.lookup({"m": hashes}))
    write = await _ms_per_call(lambda: index.record_routed("m", "r0", hashes))
    return lookup, write


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("blocks", type=int, nargs="*", default=[940, 2400, 10000],
                   help="prompt sizes in blocks")


def run(args: argparse.Namespace) -> int:
    sizes = args.blocks
    print("| blocks | lookup ms | record_routed ms |\n|---:|---:|---:|")
    for blocks in sizes:
        lookup, write = asyncio.run(measure(blocks))
        print(f"| {blocks:,} | {lookup:.3f} | {write:.3f} |")
    return 0
