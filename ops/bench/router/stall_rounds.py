"""``kvroute bench router --stall N``: the prompt cache's stall figure alone, N rounds per ingress.

The full run measures the stall once per mode: 8 short streams, their inter-chunk p99 over
3 s unloaded, then over the ~0.8 s in which one cold 160k-token prompt arrives. At 50
chunks a second that second p99 is about the third-largest of ~300 gaps, so a single
10 ms pause of the router or the worker sets it, and one run reads anywhere from 1.2x to
2x (docs/benchmarks.md). This runs the stall alone on "after" (this tree,
prompt cache on), on a fresh stack per round, alternating the ingresses, and reports each
round and the median ratio per ingress.

    kvroute bench router --stall 4 --stall-ingress proxy,direct --out stall.json
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ops.bench.compare.bench import build_config
from ops.bench.harness.procs import free_port
from ops.bench.harness.stack import stack
from ops.bench.router import bench as rb

StallRun = Callable[[str, int], dict[str, float]]  # (ingress, round) -> stall figures


def one_round(model_path: str, prompts: rb.Prompts, spec: rb.RouterBenchSpec) -> StallRun:
    """A fresh local Ray per round: one router and one sim replica, as the full run's."""

    def run(ingress: str, round_: int) -> dict[str, float]:
        cfg = build_config(rb.bench_stack(spec, ingress), model_path, free_port())
        with rb._environment(rb.MODES["after"]), stack(cfg) as url:  # noqa: SLF001
            return asyncio.run(rb.stall(spec, prompts, url, f"stall-{ingress}-{round_}"))

    return run


def stall_rounds(run: StallRun, rounds: int, ingresses: Sequence[str],
                 show: bool = True) -> dict[str, Any]:
    """Each round runs every ingress once, in turn; ratio = loaded p99 / unloaded p99."""
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        for ingress in ingresses:
            gaps = run(ingress, i)
            row = {"round": i + 1, "ingress": ingress, **gaps,
                   "ratio": gaps["cold_long_prompt_p99_s"] / gaps["unloaded_p99_s"]}
            out.append(row)
            if show:
                print(f"  stall round {i + 1} {ingress}: ratio {row['ratio']:.2f}", flush=True)
    median = {ing: statistics.median(r["ratio"] for r in out if r["ingress"] == ing)
              for ing in ingresses}
    return {"stall_rounds": {"rounds": out, "median_ratio": median}}


def markdown(result: dict[str, Any]) -> str:
    got = result["stall_rounds"]
    lines = ["| round | ingress | stream gap p99 unloaded ms | p99 while a cold long prompt "
             "arrives ms | max ms | ratio |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['round']} | {r['ingress']} | {rb.stall_cells(r)} | {r['ratio']:.2f} |"
              for r in got["rounds"]]
    lines.append("")
    lines += [f"median ratio, {ing}: {m:.2f}x" for ing, m in got["median_ratio"].items()]
    return "\n".join(lines) + "\n"


def cli(args: Any, model_path: str) -> tuple[dict[str, Any], str]:
    spec = rb.RouterBenchSpec(lengths=(args.stall_length,))
    run = one_round(model_path, rb.Prompts(model_path), spec)
    result = stall_rounds(run, args.stall, args.stall_ingress.split(","), show=not args.quiet)
    return result, markdown(result)
