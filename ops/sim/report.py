"""Bench JSON (the schema in docs/architecture.md, shared with ``kvroute bench``) and tables.

Definitions, all in virtual seconds:

* TTFT: first token - arrival (queueing + the request's own prefill).
* TPOT: (finish - first token) / (completion tokens - 1), requests with >= 2 tokens.
* E2E: finish - arrival.
* throughput_tok_s: completion tokens / (last finish - first arrival).
* cached_token_ratio: tokens the engines served from cache / prompt tokens (actual), any
  tier; ``params.host_cached_token_ratio``: the part reloaded from the host tier.
* predicted_cached_token_ratio: the index's matched tokens for the chosen replica at
  routing time (capped at prompt - 1 as the engine counts) / prompt tokens.
* Percentiles: linear interpolation between order statistics (numpy's default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ops.sim.simulator import SimResult

BENCH_KEYS = (
    "workload", "policy", "replicas", "requests", "errors", "ttft_s", "tpot_s", "e2e_s",
    "throughput_tok_s", "cached_token_ratio", "predicted_cached_token_ratio",
    "per_replica_requests", "params",
)


def _stats(xs: Sequence[float], pcts: Sequence[int]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in pcts}}
    arr = np.asarray(xs, dtype=float)
    out = {"mean": float(arr.mean())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in pcts})
    return out


def bench_json(result: SimResult, workload: str, params: Mapping[str, Any]) -> dict[str, Any]:
    done = [r for r in result.records if r.finish_s is not None and r.first_token_s is not None]
    ttft = [r.first_token_s - r.arrival_s for r in done]  # type: ignore[operator]
    e2e = [r.finish_s - r.arrival_s for r in done]  # type: ignore[operator]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.completion_tokens - 1)  # type: ignore[operator]
        for r in done if r.completion_tokens > 1
    ]
    prompt = sum(r.prompt_tokens for r in done)
    start = min((r.arrival_s for r in result.records), default=0.0)
    end = max((r.finish_s for r in done), default=start)  # type: ignore[type-var]
    per_replica = {name: 0 for name in result.replicas}
    for r in result.records:
        per_replica[r.replica] += 1
    return {
        "workload": workload,
        "policy": result.config.policy,
        "replicas": result.config.replicas,
        "requests": len(result.records),
        "errors": len(result.records) - len(done),
        "ttft_s": _stats(ttft, (50, 90, 99)),
        "tpot_s": _stats(tpot, (50, 99)),
        "e2e_s": _stats(e2e, (50, 99)),
        "throughput_tok_s": sum(r.completion_tokens for r in done) / max(end - start, 1e-9),
        "cached_token_ratio": sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        "predicted_cached_token_ratio":
            sum(r.predicted_cached for r in done) / prompt if prompt else 0.0,
        "per_replica_requests": per_replica,
        "params": dict(params),
    }


def host_ratio(result: SimResult) -> float:
    """Prompt tokens served from the host tier / prompt tokens (finished requests)."""
    done = [r for r in result.records if r.finish_s is not None]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(r.host_cached_tokens for r in done) / prompt if prompt else 0.0


def prefill_busy(result: SimResult) -> float:
    """Realised prefill load: prefill seconds / (replicas x arrival window). Above 1,
    the trace brings more prefill than the fleet can do and queues grow."""
    recs = result.records
    if not recs:
        return 0.0
    window = max(r.arrival_s for r in recs) - min(r.arrival_s for r in recs)
    return sum(result.prefill_busy_s.values()) / (max(window, 1e-9) * len(result.replicas))


_COLUMNS = (
    ("workload", "{:<22}"), ("N", "{:>2}"), ("load", "{:>5.2f}"), ("speedup", "{:>7.3f}"),
    ("policy", "{:<20}"), ("ttft_mean", "{:>9.3f}"), ("ttft_p50", "{:>8.3f}"),
    ("ttft_p99", "{:>8.3f}"), ("hit%", "{:>5.1f}"), ("host%", "{:>5.1f}"), ("pred%", "{:>5.1f}"),
    ("busy%", "{:>5.1f}"),
)


def row(bench: Mapping[str, Any]) -> dict[str, Any]:
    p, t = bench["params"], bench["ttft_s"]
    return {
        "workload": bench["workload"], "N": bench["replicas"], "load": p["offered_load"],
        "speedup": p["speedup"], "policy": bench["policy"], "ttft_mean": t["mean"],
        "ttft_p50": t["p50"], "ttft_p99": t["p99"],
        "hit%": 100 * bench["cached_token_ratio"],
        "host%": 100 * p.get("host_cached_token_ratio", 0.0),
        "pred%": 100 * bench["predicted_cached_token_ratio"],
        "busy%": 100 * p["prefill_busy"],
    }


def format_table(benches: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table, one line per run (TTFT in seconds, ratios in %)."""
    widths = [len(fmt.format(0)) for _, fmt in _COLUMNS]
    head = " ".join(name.rjust(w) if "<" not in fmt else name.ljust(w)
                    for (name, fmt), w in zip(_COLUMNS, widths, strict=True))
    lines = [head]
    for b in benches:
        r = row(b)
        lines.append(" ".join(fmt.format(r[name]) for name, fmt in _COLUMNS))
    return "\n".join(lines)


def markdown_table(benches: Sequence[Mapping[str, Any]]) -> str:
    names = [name for name, _ in _COLUMNS]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for b in benches:
        r = row(b)
        cells = [fmt.format(r[name]).strip() for name, fmt in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
