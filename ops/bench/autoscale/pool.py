"""Repeats of ``bench autoscale`` pooled per policy, and the autoscaler's two goal points.

One 76-request run's p90 is set by one burst and moves by more than the goals' margins, so
the goal is read on repeats: each policy's requests pooled (a failed request counts as an
infinite TTFT), its replica-seconds averaged, and the kvroute run set against the line
through two serve-default runs (two ``--target-ongoing`` values):

    kvroute bench autoscale-pool docs/benchmarks/autoscale-repeat*.json

* (b) replica-seconds at equal p90: kvroute's over the default's read off that line at
  kvroute's p90, and a bound that needs no line: over the most replica-seconds a default
  run used while its p90 was still at or above kvroute's (if more replicas never raise
  the p90, the default needs at least that many to match kvroute);
* (a) p90 at equal replica-seconds: kvroute's over the default's on that line.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Pooled:
    policy: str
    runs: int
    requests: int
    errors: int
    replica_s: float  # mean over the runs
    p50: float
    p90: float
    p99: float
    within: float  # share of requests with TTFT <= the target


def quantile(xs: list[float], q: float) -> float:
    """Linear, as ``report.stats``; not numpy's, which reads a step onto inf as NaN."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    if xs[hi] == math.inf:
        return xs[lo] if k == lo else math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def pool(benches: list[dict[str, Any]]) -> dict[str, Pooled]:
    """Each policy label's runs pooled (bench JSONs with ``ttft_over_time``)."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for b in benches:
        by[b["policy"]].append(b)
    out = {}
    for policy, runs in by.items():
        ttft = [math.inf if t is None else t for b in runs for _, t in b["ttft_over_time"]]
        target = runs[0]["ttft_target_s"]
        out[policy] = Pooled(
            policy, len(runs), len(ttft), sum(t == math.inf for t in ttft),
            sum(b["replica_seconds"] for b in runs) / len(runs),
            quantile(ttft, 0.5), quantile(ttft, 0.9), quantile(ttft, 0.99),
            sum(t <= target for t in ttft) / len(ttft))
    return out


def goal_points(kv: Pooled, d1: Pooled, d2: Pooled) -> dict[str, float]:
    """(b) and (a) against the line through the default's two runs ``d1``, ``d2`` (NaN
    where the runs' noise made more replica-seconds give a higher p90: no line to read)."""
    slower = [d for d in (d1, d2) if d.p90 >= kv.p90]
    bound = kv.replica_s / max(d.replica_s for d in slower) if slower else math.nan
    slope = (d2.replica_s - d1.replica_s) / (d2.p90 - d1.p90)  # replica-s per s of p90
    if not slope < 0:
        return {"b_replica_s_at_equal_p90": math.nan, "b_bound_no_line": bound,
                "a_p90_at_equal_replica_s": math.nan}
    at_p90 = d1.replica_s + slope * (kv.p90 - d1.p90)
    at_rs = d1.p90 + (kv.replica_s - d1.replica_s) / slope
    return {"b_replica_s_at_equal_p90": kv.replica_s / at_p90, "b_bound_no_line": bound,
            "a_p90_at_equal_replica_s": kv.p90 / at_rs}


def markdown(pooled: dict[str, Pooled]) -> str:
    lines = ["| policy | runs | requests | errors | TTFT p50 | p90 | p99 (s) | within target "
             "| replica-s (mean) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in pooled.values():
        lines.append(f"| {p.policy} | {p.runs} | {p.requests} | {p.errors} | {p.p50:.2f} | "
                     f"{p.p90:.2f} | {p.p99:.2f} | {100 * p.within:.1f} % | "
                     f"{p.replica_s:.0f} |")
    return "\n".join(lines)


def add_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("files", nargs="+", type=Path, help="bench autoscale JSONs (one per run)")


def run(args: argparse.Namespace) -> int:
    pooled = pool([json.loads(f.read_text()) for f in args.files])
    print(markdown(pooled))
    kv = [p for name, p in pooled.items() if name.startswith("kvroute")]
    defaults = sorted((p for name, p in pooled.items() if name.startswith("serve-default")),
                      key=lambda p: p.replica_s)
    for k in kv:
        if len(defaults) >= 2:
            points = goal_points(k, defaults[-1], defaults[0])
            print(f"\n{k.policy}: " + ", ".join(f"{n} {v:.2f}x" for n, v in points.items()))
    return 0
