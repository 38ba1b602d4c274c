"""``kvroute bench index``: latency of the Redis prefix index against Redis PING, and memory.

    kvroute bench index --redis-url redis://127.0.0.1:6379/0 --replicas 16 --blocks 100000 \\
        --prompt-tokens 32768 --out bench-index.json

Workload (deterministic for a given ``--seed``). Every prompt is ``--prompt-tokens`` random
token ids, i.e. ``n = prompt_tokens // block_size`` chained block hashes (512 for 32k tokens
at 64). The index of one model is filled, through ``RedisPrefixIndex.apply_events`` (the real
write path), with prompts held by several replicas, each to its own uniformly random depth
in ``[1, n]`` blocks, until at least ``--blocks`` (block, replica) entries are stored. How
many replicas hold a prompt depends on its class:

    class    weight  holders                      what it stands for
    miss      20 %   none (never stored)          a new conversation / unseen system prompt
    typical   60 %   1 or 2 of the replicas       a conversation pinned to its replica
    heavy     20 %   3 .. all replicas            a popular shared prefix
    all      (own row, not in the mix)            worst case: every replica holds it

Each timed lookup is ONE full prompt (all ``n`` hashes) of a class drawn by weight, in random
order; the "lookup" p50 / p99 are over that mix. Each lookup is preceded by a PING on the same
client and connection, so both see the same machine noise. Before timing, every stored prompt
is looked up once and its result compared with the depths written (``mismatches`` counts the
differences; 0 expected). Memory: ``INFO used_memory`` before / after the fill divided by the
entries stored (``bytes_per_block``), cross-checked with ``MEMORY USAGE`` of one holdings HASH.

Goal (the Redis index's): lookup p50 <= 3 x PING p50 and lookup p99 <= 10 x PING p50.

Safe on a shared Redis: keys live in a fresh namespace ``kvroute-bench-<random>`` that is
UNLINKed (SCAN + UNLINK of that namespace only, never FLUSH*) at the end, even on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from cache_service import BlockStored, IndexSettings, RedisPrefixIndex, block_hashes

__all__ = ["add_arguments", "run"]

MODEL = "bench/model"
MIX = {"miss": 0.2, "typical": 0.6, "heavy": 0.2}  # lookup classes by weight; "all" aside
WARMUP = 50
GOAL_P50, GOAL_P99 = 3.0, 10.0  # x PING p50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", required=True, help="e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--replicas", type=int, default=16, help="replicas of the model")
    parser.add_argument(
        "--blocks", type=int, default=100_000, help="(block, replica) entries to fill"
    )
    parser.add_argument("--prompt-tokens", type=int, default=32_768, help="tokens per prompt")
    parser.add_argument("--block-size", type=int, default=64, help="tokens per hashed block")
    parser.add_argument("--lookups", type=int, default=2000, help="timed lookups in the mix")
    parser.add_argument("--seed", type=int, default=0, help="workload random seed")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")


def run(args: argparse.Namespace) -> int:
    """Fill, measure, print a table, write ``--out``; 0 if the goal holds, else 1."""
    if args.replicas < 1 or args.blocks < 1 or args.lookups < 1:
        raise SystemExit("--replicas, --blocks and --lookups must be >= 1")
    if args.prompt_tokens < args.block_size or args.block_size < 1:
        raise SystemExit("--prompt-tokens must hold at least one --block-size block")
    report = asyncio.run(_bench(args))
    print(format_table(report))
    if args.out is not None:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if report["goal_ok"] else 1


# ---- workload ------------------------------------------------------------------------------


@dataclass
class Workload:
    """Prompts (block hashes) by class, each with the depth written for each holder."""

    n: int
    replicas: list[str]
    prompts: dict[str, list[tuple[list[int], dict[str, int]]]] = field(default_factory=dict)
    entries: int = 0


def _holders(cls: str, replicas: list[str], rng: random.Random) -> list[str]:
    total = len(replicas)
    count = {
        "typical": rng.randint(1, min(2, total)),
        "heavy": rng.randint(min(3, total), total),
        "all": total,
    }[cls]
    return rng.sample(replicas, count)


def build_workload(args: argparse.Namespace, rng: random.Random) -> Workload:
    """Prompts of each class until ``--blocks`` entries; at least one per stored class."""
    n = args.prompt_tokens // args.block_size
    replicas = [f"SERVE_REPLICA::kvroute#LLM#{i:06x}" for i in range(args.replicas)]
    work = Workload(n, replicas, {c: [] for c in ("miss", "typical", "heavy", "all")})
    tokens = np.random.default_rng(args.seed)
    stored = ["typical", "heavy"]
    weights = [MIX[c] for c in stored]
    queue = ["typical", "heavy", "all"]
    while queue or work.entries < args.blocks:
        cls = queue.pop(0) if queue else rng.choices(stored, weights)[0]
        ids = tokens.integers(0, 150_000, size=args.prompt_tokens, dtype=np.uint32)
        hashes = block_hashes(ids, args.block_size, salt=rng.getrandbits(64))
        depths = {r: rng.randint(1, n) for r in _holders(cls, replicas, rng)}
        work.prompts[cls].append((hashes, depths))
        work.entries += sum(depths.values())
    for _ in range(8):  # never stored: misses
        ids = tokens.integers(0, 150_000, size=args.prompt_tokens, dtype=np.uint32)
        work.prompts["miss"].append((block_hashes(ids, args.block_size, salt=1), {}))
    return work


def lookup_plan(work: Workload, lookups: int, rng: random.Random) -> list[tuple[str, list[int]]]:
    """``lookups`` prompts drawn by MIX weight, plus ``lookups // 4`` of class "all"."""
    classes = rng.choices(list(MIX), list(MIX.values()), k=lookups)
    classes += ["all"] * max(1, lookups // 4)
    rng.shuffle(classes)
    return [(c, rng.choice(work.prompts[c])[0]) for c in classes]


async def fill(index: RedisPrefixIndex, work: Workload) -> None:
    for cls in ("typical", "heavy", "all"):
        for hashes, depths in work.prompts[cls]:
            events = [BlockStored(MODEL, r, tuple(hashes[:d])) for r, d in depths.items()]
            await index.apply_events(events)


async def count_mismatches(index: RedisPrefixIndex, work: Workload) -> int:
    """Lookups whose result differs from the depths written (holdings are prefix-closed)."""
    bad = 0
    for prompts in work.prompts.values():
        for hashes, depths in prompts:
            got = (await index.lookup({MODEL: hashes}))[MODEL]
            bad += got != depths
    return bad


# ---- measurement ---------------------------------------------------------------------------


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _evalsha_usec(client: aioredis.Redis) -> tuple[int, int]:
    stat = (await client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stat.get("calls", 0)), int(stat.get("usec", 0))


async def time_lookups(
    index: RedisPrefixIndex, plan: list[tuple[str, list[int]]]
) -> tuple[list[float], dict[str, list[float]]]:
    """PING then lookup, alternately, for every planned prompt; seconds per call."""
    client, clock = index.client, time.perf_counter
    for _, hashes in plan[:WARMUP]:
        await client.ping()
        await index.lookup({MODEL: hashes})
    pings: list[float] = []
    by_class: dict[str, list[float]] = {c: [] for c in (*MIX, "all")}
    for cls, hashes in plan:
        start = clock()
        await client.ping()
        mid = clock()
        await index.lookup({MODEL: hashes})
        by_class[cls].append(clock() - mid)
        pings.append(mid - start)
    return pings, by_class


async def memory_per_entry(index: RedisPrefixIndex, work: Workload) -> dict[str, float]:
    """Fill the index; INFO used_memory delta per entry, and MEMORY USAGE of one HASH."""
    client = index.client
    before = int((await client.info("memory"))["used_memory"])
    await fill(index, work)
    after = int((await client.info("memory"))["used_memory"])
    key = index.key("r", MODEL, work.replicas[0])
    usage = await client.memory_usage(key, samples=0) or 0
    length = await client.hlen(key) or 1
    return {
        "bytes_per_block": (after - before) / work.entries,
        "memory_usage_bytes_per_entry": usage / length,
    }


async def cleanup(client: aioredis.Redis, prefix: str) -> int:
    """UNLINK every key of the bench namespace (and nothing else); returns how many."""
    keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
    return int(await client.unlink(*keys)) if keys else 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    settings = IndexSettings(namespace=f"kvroute-bench-{uuid.uuid4().hex[:12]}")
    index = RedisPrefixIndex(args.redis_url, settings, timeout_s=5.0)
    try:
        await index.client.ping()
        work = build_workload(args, rng)
        memory = await memory_per_entry(index, work)
        mismatches = await count_mismatches(index, work)
        plan = lookup_plan(work, args.lookups, rng)
        calls0, usec0 = await _evalsha_usec(index.client)
        pings, by_class = await time_lookups(index, plan)
        calls1, usec1 = await _evalsha_usec(index.client)
        server_us = (usec1 - usec0) / max(1, calls1 - calls0)
        version = (await index.client.info("server"))["redis_version"]
        return make_report(args, work, pings, by_class, memory) | {
            "namespace": settings.namespace,
            "mismatches": mismatches,
            "server_us_per_lookup": round(server_us, 1),
            "redis_version": version,
        }
    finally:
        try:
            await cleanup(index.client, index.prefix)
        except (aioredis.RedisError, OSError) as exc:  # do not mask the original error
            print(f"could not delete the keys {index.prefix}*: {exc!r}", file=sys.stderr)
        await index.close()


# ---- report --------------------------------------------------------------------------------


def make_report(
    args: argparse.Namespace,
    work: Workload,
    pings: list[float],
    by_class: dict[str, list[float]],
    memory: dict[str, float],
) -> dict[str, Any]:
    mix = [s for c in MIX for s in by_class[c]]
    ping_p50 = _pct(pings, 0.5)
    p50, p99 = _pct(mix, 0.5), _pct(mix, 0.99)
    classes = {
        c: {
            "weight": MIX.get(c, 0.0),
            "count": len(s),
            "p50_s": _pct(s, 0.5) if s else None,
            "p99_s": _pct(s, 0.99) if s else None,
        }
        for c, s in by_class.items()
    }
    return {
        "lookup_p50_s": p50,
        "lookup_p99_s": p99,
        "ping_p50_s": ping_p50,
        "ping_p99_s": _pct(pings, 0.99),
        "p50_ratio": p50 / ping_p50,
        "p99_ratio": p99 / ping_p50,
        "goal_p50_ok": p50 <= GOAL_P50 * ping_p50,
        "goal_p99_ok": p99 <= GOAL_P99 * ping_p50,
        "goal_ok": p50 <= GOAL_P50 * ping_p50 and p99 <= GOAL_P99 * ping_p50,
        "noisy": _pct(pings, 0.99) > GOAL_P99 * ping_p50,  # PING alone misses the p99 goal
        "bytes_per_block": round(memory["bytes_per_block"], 1),
        "memory_usage_bytes_per_entry": round(memory["memory_usage_bytes_per_entry"], 1),
        "mib_per_million_entries": round(memory["bytes_per_block"] * 1e6 / 2**20, 1),
        "replicas": args.replicas,
        "blocks": args.blocks,
        "entries": work.entries,
        "prompt_tokens": args.prompt_tokens,
        "block_size": args.block_size,
        "blocks_per_prompt": work.n,
        "lookups": len(mix),
        "classes": classes,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {_cpus()} CPUs, {platform.system()}",
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def format_table(r: dict[str, Any]) -> str:
    us = 1e6
    ping = r["ping_p50_s"]
    rows = [("PING", r["ping_p50_s"], r["ping_p99_s"])]
    rows.append(("lookup (mix)", r["lookup_p50_s"], r["lookup_p99_s"]))
    for name, c in r["classes"].items():
        if c["count"]:
            label = f"  {name} ({c['weight']:.0%})" if name in MIX else f"  {name} (not in mix)"
            rows.append((label, c["p50_s"], c["p99_s"]))
    lines = [
        f"kvroute bench index: {r['replicas']} replicas, {r['entries']} entries "
        f"(--blocks {r['blocks']}), {r['prompt_tokens']}-token prompts = "
        f"{r['blocks_per_prompt']} blocks of {r['block_size']}, Redis {r['redis_version']}",
        f"{'':26s}{'p50 us':>10s}{'p99 us':>10s}{'p50/PING':>10s}{'p99/PING':>10s}",
    ]
    for label, p50, p99 in rows:
        lines.append(
            f"{label:26s}{p50 * us:10.0f}{p99 * us:10.0f}{p50 / ping:10.2f}{p99 / ping:10.2f}"
        )
    ok = {True: "OK", False: "MISSED"}
    if r["noisy"]:
        lines.append(
            f"NOISY MACHINE: PING's own p99 is {r['ping_p99_s'] / ping:.0f} x its p50 "
            f"(> {GOAL_P99:g}): the p99 goal cannot be judged on this run"
        )
    lines += [
        f"goal p50 <= {GOAL_P50:g} x PING p50: {r['p50_ratio']:.2f} x  {ok[r['goal_p50_ok']]}",
        f"goal p99 <= {GOAL_P99:g} x PING p50: {r['p99_ratio']:.2f} x  {ok[r['goal_p99_ok']]}",
        f"server time per lookup (commandstats): {r['server_us_per_lookup']:.0f} us; "
        f"result mismatches: {r['mismatches']}",
        f"memory: {r['bytes_per_block']:.0f} B per (block, replica) entry (INFO used_memory), "
        f"{r['memory_usage_bytes_per_entry']:.0f} B (MEMORY USAGE); "
        f"{r['mib_per_million_entries']:.0f} MiB per 1M entries",
    ]
    return "\n".join(lines)
