"""``kvroute bench overhead``: kvroute in front of an engine against the engine's own server.

    kvroute bench overhead --engine mlx --replicas 1 --out overhead-mlx.json

Both targets (``ops.bench.overhead.targets``) are started once and kept up; then for each
cell (a mode of ``ops.bench.overhead.workload`` at one concurrency) the same closed-loop
streaming load runs against ``bare``, ``kvroute``, ``bare``, ``kvroute``... (``rounds``
pairs), each run for ``cell_s`` seconds. A round's salt is shared by both targets and new
for every round and cell, so each run starts from a cold cache and both targets see the
same requests. Every target is warmed up first (its model loaded, its code paths run).

Per run: the bench JSON fields (``ops.bench.harness.report.bench_json``) plus ``target``,
``mode``, ``concurrency``, ``round``, ``itl_s`` (each request's mean inter-token time:
(last token - first) / (tokens - 1)), the load average before the run. Per cell: both
targets' runs pooled (throughput the mean of the runs', TTFT and ITL percentiles over all
requests) and kvroute over bare. ``ratios`` sums the cells: the throughput ratio is the
geometric mean of the cells', the TTFT p50 delta the median of the cells'.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ops.bench.harness.client import Client, LoadSpec, Record, Runner
from ops.bench.harness.procs import Subprocess, free_port
from ops.bench.harness.report import bench_json, stats
from ops.bench.overhead import targets
from ops.bench.overhead.workload import MODES, PromptText, Workload, closed_loop, requests

TARGETS = ("bare", "kvroute")
WARMUP_REQUESTS = 3


@dataclass(frozen=True, slots=True)
class OverheadSpec:
    settings: targets.EngineSettings
    replicas: int = 1
    workload: Workload = field(default_factory=Workload)
    modes: tuple[str, ...] = MODES
    concurrencies: tuple[int, ...] = (1, 4, 8)
    rounds: int = 2  # bare/kvroute pairs per cell
    cell_s: float = 20.0
    pause_s: float = 1.0
    drain_timeout_s: float = 120.0
    stream_interval_ms: float = 0.0  # kvroute's stream pacing, set explicitly

    def __post_init__(self) -> None:
        if self.replicas not in (1, 2):
            raise ValueError("replicas must be 1 or 2")
        if bad := set(self.modes) - set(MODES):
            raise ValueError(f"unknown modes {sorted(bad)}; known: {MODES}")


@dataclass(slots=True)
class Target:
    name: str
    url: str
    model: str


@contextlib.asynccontextmanager
async def bare_target(spec: OverheadSpec) -> AsyncIterator[Target]:
    """The engine's own server(s), behind a round-robin front at two replicas."""
    procs: list[Subprocess] = []
    model = ""
    try:
        for i in range(spec.replicas):
            proc, model = targets.bare_server(spec.settings, f"bare-{spec.settings.engine}-{i}")
            procs.append(proc)
            await proc.__aenter__()
        url = targets.base_url(procs[0])
        if spec.replicas > 1:
            front = targets.round_robin([targets.base_url(p) for p in procs])
            procs.append(front)
            await front.__aenter__()
            url = targets.base_url(front)
        yield Target("bare", url, model)
    finally:
        for p in reversed(procs):
            p.stop()


async def warm_up(target: Target, spec: OverheadSpec, text: PromptText) -> None:
    load = LoadSpec(duration_s=600.0, concurrency=1, ramp_s=0.0)
    reqs = requests("shared", f"warm-{target.name}", spec.workload, text)
    async with Client(target.url, target.model) as client:
        runner = Runner(client, load, "warm-up", show=False)
        for _ in range(WARMUP_REQUESTS):
            rec = await runner.call(next(reqs))
            if rec is None or not rec.ok:
                raise RuntimeError(f"{target.name} failed its warm-up: "
                                   f"{rec.error if rec else 'no answer'}")


async def one_run(target: Target, spec: OverheadSpec, text: PromptText, mode: str,
                  concurrency: int, rnd: int, show: bool) -> tuple[dict[str, Any], list[Record]]:
    salt = f"r{rnd}-{mode}-c{concurrency}"
    load = LoadSpec(duration_s=spec.cell_s, concurrency=concurrency, ramp_s=0.0,
                    drain_timeout_s=spec.drain_timeout_s)
    load_avg = os.getloadavg()[0]
    driver = closed_loop(requests(mode, salt, spec.workload, text), concurrency)
    async with Client(target.url, target.model) as client:
        records = await Runner(client, load, f"{target.name} {salt}", show).run(driver)
    run = bench_json(records, workload=f"overhead-{mode}", policy=target.name,
                     replicas=spec.replicas, params={"salt": salt, "load": asdict(load)})
    run.update(target=target.name, mode=mode, concurrency=concurrency, round=rnd,
               itl_s=stats([r.tpot_s for r in records if r.ok and r.tpot_s is not None],
                           (50, 90, 99)),
               load_avg_1m=load_avg)
    return run, records


async def run_cells(spec: OverheadSpec, kvroute_url: str, show: bool = True
                    ) -> dict[str, Any]:
    """Every cell, bare and kvroute alternated; the result JSON without ``command``."""
    text = PromptText(spec.settings.model_path)
    runs: list[dict[str, Any]] = []
    cells: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    async with bare_target(spec) as bare:
        kv = Target("kvroute", kvroute_url, targets.MODEL)
        for t in (bare, kv):
            await warm_up(t, spec, text)
        for mode in spec.modes:
            for c in spec.concurrencies:
                pooled: dict[str, list[tuple[dict[str, Any], list[Record]]]] = \
                    {n: [] for n in TARGETS}
                for rnd in range(spec.rounds):
                    for t in (bare, kv):
                        await asyncio.sleep(spec.pause_s)
                        run, records = await one_run(t, spec, text, mode, c, rnd, show)
                        runs.append(run)
                        pooled[t.name].append((run, records))
                cells.append(cell_summary(mode, c, pooled))
    return {"engine": spec.settings.engine, "replicas": spec.replicas,
            "model_path": spec.settings.model_path, "runs": runs, "cells": cells,
            "ratios": overall_ratios(cells), "goals": goals(spec, cells),
            "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
            "params": params(spec)}


def pooled_stats(runs: list[tuple[dict[str, Any], list[Record]]]) -> dict[str, Any]:
    done = [r for _, recs in runs for r in recs if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    return {
        "runs": len(runs),
        "requests": sum(run["requests"] for run, _ in runs),
        "errors": sum(run["errors"] for run, _ in runs),
        "throughput_tok_s": statistics.fmean(run["throughput_tok_s"] for run, _ in runs),
        "ttft_s": stats([r.ttft_s for r in done if r.ttft_s is not None], (50, 90, 99)),
        "itl_s": stats([r.tpot_s for r in done if r.tpot_s is not None], (50, 90, 99)),
        "cached_token_ratio": sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        "prompt_tokens_mean": prompt / len(done) if done else 0.0,
    }


def cell_summary(mode: str, concurrency: int,
                 pooled: dict[str, list[tuple[dict[str, Any], list[Record]]]]
                 ) -> dict[str, Any]:
    by = {name: pooled_stats(runs) for name, runs in pooled.items()}
    b, k = by["bare"], by["kvroute"]
    return {"mode": mode, "concurrency": concurrency, **by, "ratios": {
        "throughput": k["throughput_tok_s"] / b["throughput_tok_s"]
        if b["throughput_tok_s"] else 0.0,
        "ttft_p50_delta_s": k["ttft_s"]["p50"] - b["ttft_s"]["p50"],
        "ttft_p99_delta_s": k["ttft_s"]["p99"] - b["ttft_s"]["p99"],
        "itl_p50_delta_s": k["itl_s"]["p50"] - b["itl_s"]["p50"],
        "cached_token_ratio_diff": k["cached_token_ratio"] - b["cached_token_ratio"],
    }}


def overall_ratios(cells: list[dict[str, Any]]) -> dict[str, float]:
    tp = [c["ratios"]["throughput"] for c in cells if c["ratios"]["throughput"] > 0]
    med = {k: float(np.median([c["ratios"][k] for c in cells])) if cells else 0.0
           for k in ("ttft_p50_delta_s", "ttft_p99_delta_s", "itl_p50_delta_s",
                     "cached_token_ratio_diff")}
    return {"throughput": float(np.exp(np.mean(np.log(tp)))) if tp else 0.0, **med}


def goals(spec: OverheadSpec, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal for kvroute in front of one replica: throughput >= 0.95x the bare engine,
    TTFT p50 at most 5 ms more (over the cells: their geometric mean and median)."""
    r = overall_ratios(cells)
    out: dict[str, Any] = {"throughput_at_least": 0.95, "ttft_p50_delta_at_most_s": 0.005,
                           "zero_errors": all(c[t]["errors"] == 0 for c in cells
                                              for t in TARGETS)}
    if spec.replicas == 1:
        out.update(throughput_met=r["throughput"] >= 0.95,
                   ttft_p50_met=r["ttft_p50_delta_s"] <= 0.005)
    return out


def params(spec: OverheadSpec) -> dict[str, Any]:
    return {"settings": asdict(spec.settings), "workload": asdict(spec.workload),
            "modes": list(spec.modes), "concurrencies": list(spec.concurrencies),
            "rounds": spec.rounds, "cell_s": spec.cell_s,
            "stream_interval_ms": spec.stream_interval_ms,
            "bare_command": spec.settings.bare_command(0)[0][1:],
            "kvroute_engine_kwargs": spec.settings.engine_kwargs(),
            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())}


def run_overhead(spec: OverheadSpec, show: bool = True, port: int = 0) -> dict[str, Any]:
    """On the running Ray (``harness.stack.local_ray``): deploy kvroute (on ``port``, 0: a
    free one), run, clean up."""
    from ops.bench.harness.config import build
    from ops.bench.harness.stack import deployed

    cfg = build(targets.stack_spec(spec.settings, spec.replicas, port or free_port(),
                                   spec.stream_interval_ms))
    with deployed(cfg, timeout_s=900.0) as url:
        return asyncio.run(run_cells(spec, url, show))
