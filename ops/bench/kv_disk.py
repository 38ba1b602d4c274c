"""Reload from the mlx disk tier vs re-prefill, for the same prefix, on this machine.

    kvroute bench kv-disk [--tokens 4096] [--model DIR] [--rounds 3]

One real ``MlxEngine`` (mlx-lm on CPU here) with a prefix store that holds one entry and a
disk tier (``engine_kwargs.disk_bytes``): prompt A is prefilled, prompt B pushes A's KV to
disk, then A again reads it back (``cached_tokens`` = A's length - 1, ``host_cached_tokens``
the same: from disk). The same A on an engine without a disk tier is prefilled again. Each
round alternates the two; TTFT is the time to the first streamed token. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from workers.engines.mlx.engine import MlxEngine
from workers.protocol import Finished, GenerateRequest, SamplingParams


async def _ttft(engine: MlxEngine, rid: str, ids: list[int]) -> tuple[float, Any]:
    start = time.perf_counter()
    first: float | None = None
    async for item in engine.generate(GenerateRequest(rid, ids, SamplingParams(max_tokens=1))):
        if first is None:
            first = time.perf_counter() - start
        if isinstance(item, Finished):
            return first, item.usage
    raise RuntimeError("no Finished")


async def measure(model: str, tokens: int, rounds: int) -> dict[str, Any]:
    entry = tokens * 4096 * 3 // 2  # room for one prompt's KV (4 KiB/token): B evicts A
    disk = MlxEngine(model, "m", "disk", 64, cache_bytes=entry, max_cache_entries=1,
                     disk_bytes=64 * entry)
    plain = MlxEngine(model, "m", "plain", 64, cache_bytes=entry, max_cache_entries=1)
    await disk.start()
    await plain.start()
    reload_s, prefill_s, usages = [], [], []
    try:
        for r in range(rounds):
            a = [(7 * i + r) % 4000 + 10 for i in range(tokens)]
            b = [(11 * i + r) % 4000 + 10 for i in range(tokens)]
            await _ttft(disk, f"a{r}", a)
            await _ttft(disk, f"b{r}", b)  # A's KV goes to disk
            t, usage = await _ttft(disk, f"a{r}-again", a)
            reload_s.append(t)
            usages.append((usage.cached_tokens, usage.host_cached_tokens))
            t, _ = await _ttft(plain, f"p{r}", a)  # the same prompt, prefilled
            prefill_s.append(t)
    finally:
        await disk.shutdown()
        await plain.shutdown()
    return {"prompt_tokens": tokens, "rounds": rounds,
            "reload_ttft_s": reload_s, "prefill_ttft_s": prefill_s,
            "cached_and_disk_tokens": usages,
            "speedup_median": statistics.median(prefill_s) / statistics.median(reload_s)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", help="mlx model folder (default: the tiny offline model)")


def run(args: argparse.Namespace) -> int:
    from ops.models.tiny_model import ensure_model

    out = asyncio.run(measure(args.model or str(ensure_model()), args.tokens, args.rounds))
    print(json.dumps(out, indent=2))
    return 0
