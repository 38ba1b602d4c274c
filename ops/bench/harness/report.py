"""Bench JSON (docs/architecture.md's schema, as ``kvroute sim`` writes it), tables, plots.

Definitions, on the client's clock:

* TTFT, TPOT, E2E: per request, as ``ops.bench.harness.client`` measures them; over the
  requests that succeeded. Percentiles interpolate linearly (numpy's default).
* throughput_tok_s: completion tokens / window, the window running from the first
  request sent to the last one finished.
* cached_token_ratio: cached tokens the engines reported / prompt tokens (actual).
* predicted_cached_token_ratio: kvroute's ``x-kvroute-predicted-cached-tokens`` /
  prompt tokens (0 for servers that do not send it).
* params.prefill_busy (when the prefill rate P is known, e.g. the sim engine's):
  uncached prompt tokens / (P x replicas x window), the share of the fleet's
  prefill capacity the run used. For the sim engine this is its exact prefill time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ops.bench.harness.client import Record

_STATS = {"type": "object", "additionalProperties": {"type": "number"}}


def _stat_schema(*pcts: str) -> dict[str, Any]:
    keys = ["mean", *pcts]
    return {**_STATS, "required": keys,
            "properties": {k: {"type": "number", "minimum": 0} for k in keys}}


BENCH_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kvroute bench result",
    "type": "object",
    "required": ["workload", "policy", "replicas", "requests", "errors", "ttft_s", "tpot_s",
                 "e2e_s", "throughput_tok_s", "cached_token_ratio",
                 "predicted_cached_token_ratio", "per_replica_requests", "params"],
    "properties": {
        "workload": {"type": "string"},
        "policy": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 0},
        "requests": {"type": "integer", "minimum": 0},
        "errors": {"type": "integer", "minimum": 0},
        "ttft_s": _stat_schema("p50", "p90", "p99"),
        "tpot_s": _stat_schema("p50", "p99"),
        "e2e_s": _stat_schema("p50", "p99"),
        "throughput_tok_s": {"type": "number", "minimum": 0},
        "cached_token_ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "predicted_cached_token_ratio": {"type": "number", "minimum": 0},
        "per_replica_requests": {"type": "object",
                                 "additionalProperties": {"type": "integer", "minimum": 0}},
        "params": {"type": "object"},
    },
}


def validate(bench: Mapping[str, Any]) -> None:
    """Raises ``jsonschema.ValidationError`` if ``bench`` breaks the schema."""
    import jsonschema

    jsonschema.validate(dict(bench), BENCH_SCHEMA)


def json_text(obj: Any, indent: int = 2, level: int = 0) -> str:
    """``json.dumps(obj, indent=2)``, but a list of scalars stays on one line (so the
    per-request rows of ``bench compare`` take a line each)."""
    pad, inner = " " * indent * level, " " * indent * (level + 1)
    if isinstance(obj, dict) and obj:
        items = (f"{inner}{json.dumps(str(k))}: {json_text(v, indent, level + 1)}"
                 for k, v in obj.items())
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list | tuple) and any(isinstance(v, dict | list | tuple) for v in obj):
        items = (f"{inner}{json_text(v, indent, level + 1)}" for v in obj)
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj)


def stats(xs: Sequence[float], pcts: Sequence[int]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in pcts}}
    arr = np.asarray(xs, dtype=float)
    return {"mean": float(arr.mean()), **{f"p{p}": float(np.percentile(arr, p)) for p in pcts}}


def window_s(records: Sequence[Record]) -> float:
    ends = [r.start_s + r.e2e_s for r in records if r.e2e_s is not None]
    if not records or not ends:
        return 0.0
    return max(ends) - min(r.start_s for r in records)


def bench_json(
    records: Sequence[Record], *, workload: str, policy: str, replicas: int,
    params: Mapping[str, Any], prefill_tok_s: float | None = None,
) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    completion = sum(r.completion_tokens for r in done)
    window = window_s(records)
    per_replica: dict[str, int] = {}
    for r in done:
        per_replica[r.replica or "unknown"] = per_replica.get(r.replica or "unknown", 0) + 1
    measured: dict[str, Any] = {
        "window_s": window, "prompt_tokens": prompt, "cached_tokens": cached,
        "completion_tokens": completion,
        "error_samples": sorted({r.error for r in records if r.error})[:5],
    }
    if prefill_tok_s and replicas and window > 0:
        measured["prefill_tok_s"] = prefill_tok_s
        measured["prefill_busy"] = (prompt - cached) / (prefill_tok_s * replicas * window)
    return {
        "workload": workload,
        "policy": policy,
        "replicas": replicas,
        "requests": len(records),
        "errors": len(records) - len(done),
        "ttft_s": stats([r.ttft_s for r in done if r.ttft_s is not None], (50, 90, 99)),
        "tpot_s": stats([r.tpot_s for r in done if r.tpot_s is not None], (50, 99)),
        "e2e_s": stats([r.e2e_s for r in done if r.e2e_s is not None], (50, 99)),
        "throughput_tok_s": completion / window if window > 0 else 0.0,
        "cached_token_ratio": cached / prompt if prompt else 0.0,
        "predicted_cached_token_ratio":
            sum(r.predicted_cached_tokens for r in done) / prompt if prompt else 0.0,
        "per_replica_requests": dict(sorted(per_replica.items())),
        "params": {**params, **measured},
    }


# -- tables ------------------------------------------------------------------------------
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("requests", "{:d}"), ("errors", "{:d}"), ("ttft_mean", "{:.3f}"), ("ttft_p50", "{:.3f}"),
    ("ttft_p90", "{:.3f}"), ("ttft_p99", "{:.3f}"), ("tpot_p50", "{:.4f}"),
    ("e2e_p50", "{:.2f}"), ("hit%", "{:.1f}"), ("pred%", "{:.1f}"), ("busy%", "{:.1f}"),
    ("tok/s", "{:.0f}"),
)
# bench compare's per-router extras (ops.bench.harness.lineup), shown when every run has them
_ROUTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cpu_ms/req", "{:.1f}"), ("replica_cpu_ms/req", "{:.1f}"), ("idle+ms", "{:.2f}"),
    ("per replica", "{}"),
)


def _columns(benches: Mapping[str, Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    extra = benches and all("cpu_s_per_request" in b for b in benches.values())
    return _COLUMNS + _ROUTER_COLUMNS if extra else _COLUMNS


def row(bench: Mapping[str, Any]) -> dict[str, Any]:
    t, p = bench["ttft_s"], bench["params"]
    busy = p.get("prefill_busy")
    return {
        "requests": bench["requests"], "errors": bench["errors"], "ttft_mean": t["mean"],
        "ttft_p50": t["p50"], "ttft_p90": t["p90"], "ttft_p99": t["p99"],
        "tpot_p50": bench["tpot_s"]["p50"], "e2e_p50": bench["e2e_s"]["p50"],
        "hit%": 100 * bench["cached_token_ratio"],
        "pred%": 100 * bench["predicted_cached_token_ratio"],
        "busy%": 100 * busy if busy is not None else float("nan"),
        "tok/s": bench["throughput_tok_s"],
        "cpu_ms/req": 1000 * bench.get("cpu_s_per_request", float("nan")),
        "replica_cpu_ms/req": 1000 * bench.get("replica_cpu_s_per_request", float("nan")),
        "idle+ms": 1000 * bench.get("added_latency_s", {}).get("p50", float("nan")),
        "per replica": "/".join(str(n) for n in bench["per_replica_requests"].values()),
    }


def _cells(bench: Mapping[str, Any], columns: tuple[tuple[str, str], ...]) -> list[str]:
    r = row(bench)
    return [fmt.format(r[name]) for name, fmt in columns]


def rich_table(benches: Mapping[str, Mapping[str, Any]], title: str = "") -> Any:
    """A rich Table, one row per run (TTFT/TPOT/E2E in seconds, ratios in %)."""
    from rich.table import Table

    columns = _columns(benches)
    table = Table(title=title or None)
    table.add_column("run")
    for name, _ in columns:
        table.add_column(name, justify="right")
    for name, bench in benches.items():
        table.add_row(name, *_cells(bench, columns))
    return table


def markdown_table(benches: Mapping[str, Mapping[str, Any]]) -> str:
    columns = _columns(benches)
    names = ["run", *(n for n, _ in columns)]
    lines = ["| " + " | ".join(names) + " |", "|---" + "|---:" * len(columns) + "|"]
    for name, bench in benches.items():
        lines.append("| " + " | ".join([name, *_cells(bench, columns)]) + " |")
    return "\n".join(lines)


def markdown_compare(result: Mapping[str, Any]) -> str:
    """A markdown section for ``bench compare``: command, machine, date, table, overheads."""
    env, lat = result.get("env", {}), result.get("latency_s", {})
    lines = [
        f"Command: `{result.get('command', 'kvroute bench compare')}`  ",
        f"Machine: {env.get('machine', '?')}; Python {env.get('python', '?')}, "
        f"Ray {env.get('ray', '?')}, sglang-router {env.get('sglang_router', '?')}  ",
        f"Date: {env.get('date', '?')}", "", markdown_table(result["routers"]), "",
        "| overhead (idle, minimal request) | p50 ms | p99 ms |", "|---|---:|---:|",
    ]
    for key in ("router_overhead_s", "router_overhead_goal_s", "serve_proxy_overhead_s"):
        if o := result.get(key):
            lines.append(f"| {key} | {1000 * o['p50']:.2f} | {1000 * o['p99']:.2f} |")
    for name, s in lat.items():
        lines.append(f"| latency: {name} | {1000 * s['p50']:.2f} | {1000 * s['p99']:.2f} |")
    goals = result.get("goals", {})
    lines += ["", "Goals: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}"
                                       for k, v in goals.items())]
    return "\n".join(lines) + "\n"


# -- plots -------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ttft_cdf(runs: Mapping[str, Sequence[Record]], path: str | Path, title: str) -> Path:
    """The TTFT CDF of each run, log-scaled seconds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, records in runs.items():
        xs = np.sort([r.ttft_s for r in records if r.ok])
        if len(xs):
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{name} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def plot_cached_ratio(runs: Mapping[str, Sequence[Record]], path: str | Path, title: str,
                      bin_s: float = 10.0) -> Path:
    """Cached / prompt tokens of the requests sent in each ``bin_s`` window."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, records in runs.items():
        done = [r for r in records if r.ok]
        if not done:
            continue
        bins = np.floor(np.array([r.start_s for r in done]) / bin_s).astype(int)
        prompt = np.bincount(bins, [r.prompt_tokens for r in done])
        cached = np.bincount(bins, [r.cached_tokens for r in done])
        keep = prompt > 0
        x = (np.arange(len(prompt)) + 0.5) * bin_s
        ax.plot(x[keep], cached[keep] / prompt[keep], marker=".", label=name)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"time since start (s), {bin_s:g} s bins")
    ax.set_ylabel("cached / prompt tokens")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def plot_cpu(benches: Mapping[str, Mapping[str, Any]], path: str | Path, title: str) -> Path:
    """Router CPU ms per request (and the worker replicas' beside it), one bar pair a run."""
    plt = _pyplot()
    names = list(benches)
    x = np.arange(len(names))
    router = [1000 * benches[n].get("cpu_s_per_request", np.nan) for n in names]
    replica = [1000 * benches[n].get("replica_cpu_s_per_request", np.nan) for n in names]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.bar(x - 0.2, router, 0.4, label="router processes")
    ax.bar(x + 0.2, replica, 0.4, label="worker replicas (engine emulator + endpoint)")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("CPU ms per request")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def markdown_autoscale(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """``bench autoscale`` runs as one markdown table."""
    lines = ["| run | requests | errors | TTFT p50 | p90 | p99 (s) | within target | "
             "replica-s | peak | cache lost at scale-down (least possible), blocks | "
             "machine CPU busy, mean (p90) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, b in runs.items():
        t = b["ttft_s"]
        lines.append(
            f"| {name} | {b['requests']} | {b['errors']} | {t['p50']:.2f} | {t['p90']:.2f} | "
            f"{t['p99']:.2f} | {100 * b['slo_attainment']:.1f}% | {b['replica_seconds']:.0f} | "
            f"{b['peak_replicas']} | {b['scale_down_lost_blocks']} "
            f"({b['scale_down_least_lost_blocks']}) | {_cpu_cell(b)} |")
    return "\n".join(lines) + "\n"


def _cpu_cell(bench: Mapping[str, Any]) -> str:
    if "cpu_busy_mean" not in bench:  # runs from before it was sampled
        return "-"
    return f"{100 * bench['cpu_busy_mean']:.0f}% ({100 * bench['cpu_busy_p90']:.0f}%)"


def plot_autoscale(runs: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path:
    """``bench autoscale`` runs side by side: replicas (running or starting) over time above,
    each request's TTFT at its send time below, with the target."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, bench in runs.items():
        pts = bench["replicas_over_time"]
        top.step([p[0] for p in pts], [p[2] for p in pts], where="post",
                 label=f"{label} ({bench['replica_seconds']:.0f} replica-s)")
        ttft = [p for p in bench["ttft_over_time"] if p[1] is not None]
        bottom.scatter([p[0] for p in ttft], [p[1] for p in ttft], s=4, alpha=0.5,
                       label=f"{label} (p90 {bench['ttft_s']['p90']:.2f} s)")
    target = next(iter(runs.values()))["ttft_target_s"]
    bottom.axhline(target, color="k", lw=0.8, ls="--", label=f"target {target:g} s")
    top.set_ylabel("replicas")
    top.legend(loc="upper right")
    bottom.set(ylabel="TTFT (s)", xlabel="seconds into the run", yscale="log")
    bottom.legend(loc="upper right", markerscale=3)
    fig.suptitle("bench autoscale (sim engine, shared 2-core machine)")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
