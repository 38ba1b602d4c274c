"""``kvroute status [--url U] [--json]``: models, replicas, load, index and hit rates.

Reads a running kvroute over HTTP only (``GET /health`` and ``GET /metrics``), so it
works from any machine that can reach the Serve proxy. ``/metrics`` is already the
merge of every router replica (``router.app.metrics_hub``), so the numbers cover the
whole deployment. Counters and histograms are cumulative since the routers started;
quantiles are estimated from the histogram buckets the way Prometheus'
``histogram_quantile`` does (linear interpolation inside a bucket).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_URL = "http://127.0.0.1:8000"
# The index size is not exported yet; status shows it as soon as /metrics carries it.
INDEX_ENTRIES_METRIC = "kvroute_index_blocks"
INDEX_ENTRIES_NOTE = (f"not exported: /metrics has no {INDEX_ENTRIES_METRIC} gauge "
                      "(IndexStats.blocks)")


class StatusError(Exception):
    """The server could not be reached or did not answer like kvroute."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


Samples = dict[str, list[Sample]]


def parse_metrics(text: str) -> Samples:
    """Prometheus text → samples by sample name (``x_total``, ``x_bucket``, ...)."""
    out: Samples = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name].append(Sample(s.name, dict(s.labels), float(s.value)))
    return dict(out)


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``match``."""
    return float(sum(s.value for s in samples.get(name, [])
                     if all(s.labels.get(k) == v for k, v in match.items())))


def by_label(samples: Samples, name: str, label: str, **match: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for s in samples.get(name, []):
        if all(s.labels.get(k) == v for k, v in match.items()):
            out[s.labels.get(label, "")] += s.value
    return dict(out)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' estimate from cumulative ``(le, count)`` buckets; None if empty."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower  # beyond the last finite bound: its upper edge
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def buckets_of(samples: Samples, metric: str, **match: str) -> list[tuple[float, float]]:
    """Cumulative buckets of histogram ``metric`` summed over the series matching ``match``."""
    acc: dict[float, float] = defaultdict(float)
    for s in samples.get(f"{metric}_bucket", []):
        if all(s.labels.get(k) == v for k, v in match.items()):
            acc[float(s.labels["le"])] += s.value
    return sorted(acc.items())


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def model_summary(samples: Samples, model: str, ready: int | None) -> dict[str, Any]:
    prompt = total(samples, "kvroute_prompt_tokens_total", model=model)
    cached = total(samples, "kvroute_cached_tokens_total", model=model)
    host = total(samples, "kvroute_host_cached_tokens_total", model=model)
    predicted = total(samples, "kvroute_predicted_cached_tokens_total", model=model)
    ttft = buckets_of(samples, "kvroute_ttft_seconds", model=model)
    replicas = {
        r: {"ongoing_requests": v,
            "queued_prefill_tokens": by_label(samples, "kvroute_replica_queued_prefill_tokens",
                                              "replica", model=model).get(r, 0.0)}
        for r, v in by_label(samples, "kvroute_replica_ongoing_requests", "replica",
                             model=model).items()
    }
    requests = by_label(samples, "kvroute_requests_total", "status", model=model)
    return {
        "ready_replicas": ready,
        "replicas": dict(sorted(replicas.items())),
        "requests": requests,
        "requests_total": sum(requests.values()),
        "retries": total(samples, "kvroute_retries_total", model=model),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "predicted_cached_tokens": predicted,
        "cached_ratio": _ratio(cached, prompt),
        "device_cached_ratio": _ratio(cached - host, prompt),  # hits per KV tier
        "host_cached_ratio": _ratio(host, prompt),
        "predicted_cached_ratio": _ratio(predicted, prompt),
        "prediction_accuracy": _ratio(cached, predicted),
        "ttft_p50_s": histogram_quantile(0.5, ttft),
        "ttft_p99_s": histogram_quantile(0.99, ttft),
    }


def index_summary(samples: Samples) -> dict[str, Any]:
    lookup = buckets_of(samples, "kvroute_index_lookup_seconds")
    route = buckets_of(samples, "kvroute_route_decision_seconds")
    entries = samples.get(INDEX_ENTRIES_METRIC)
    return {
        "lookups": total(samples, "kvroute_index_lookup_seconds_count"),
        "lookup_p50_s": histogram_quantile(0.5, lookup),
        "lookup_p99_s": histogram_quantile(0.99, lookup),
        "route_p50_s": histogram_quantile(0.5, route),
        "route_p99_s": histogram_quantile(0.99, route),
        "errors": by_label(samples, "kvroute_index_errors_total", "op"),
        "entries": sum(s.value for s in entries) if entries else None,
        "entries_note": None if entries else INDEX_ENTRIES_NOTE,
    }


def summarize(health: dict[str, Any], metrics_text: str) -> dict[str, Any]:
    """The status report from a ``/health`` body and a ``/metrics`` text (pure)."""
    samples = parse_metrics(metrics_text)
    ready: dict[str, int] = {str(k): int(v) for k, v in (health.get("replicas") or {}).items()}
    seen = {s.labels["model"] for ss in samples.values() for s in ss if "model" in s.labels}
    models = sorted(set(ready) | seen)
    return {
        "status": health.get("status", "unknown"),
        "models": {m: model_summary(samples, m, ready.get(m)) for m in models},
        "index": index_summary(samples),
    }


def status_data(url: str = DEFAULT_URL, timeout_s: float = 5.0) -> dict[str, Any]:
    """Fetches ``/health`` and ``/metrics`` from ``url``; raises ``StatusError`` if it can't."""
    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s) as client:
            h = client.get(f"{base}/health")
            m = client.get(f"{base}/metrics")
    except httpx.HTTPError as e:
        raise StatusError(f"cannot reach kvroute at {base}: {e}") from None
    try:
        health = h.json()
    except ValueError:
        raise StatusError(f"{base}/health answered {h.status_code} without JSON: "
                          "is this a kvroute server?") from None
    if h.status_code not in (200, 503) or not isinstance(health, dict):
        raise StatusError(f"{base}/health answered {h.status_code}: {h.text[:200]}")
    if m.status_code != 200:
        raise StatusError(f"{base}/metrics answered {m.status_code}: {m.text[:200]}")
    return {"url": base, **summarize(health, m.text)}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _dur(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s * 1e3:.2f} ms" if s < 0.01 else f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _requests(req: dict[str, float]) -> str:
    ok = req.get("ok", 0.0)
    bad = ", ".join(f"{_num(v)} {k}" for k, v in sorted(req.items()) if k != "ok" and v)
    return f"{_num(ok)} ok" + (f" ({bad})" if bad else "")


def _models_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="Models", title_justify="left")
    for col in ("model", "ready", "requests", "retries", "prompt tok", "cached (actual)",
                "device / host", "cached (predicted)", "actual/predicted", "TTFT p50",
                "TTFT p99"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for name, m in data["models"].items():
        ready = m["ready_replicas"]
        shown = "–" if ready is None else f"[{'green' if ready else 'red'}]{ready}[/]"
        t.add_row(name, shown, _requests(m["requests"]), _num(m["retries"]),
                  _num(m["prompt_tokens"]), _pct(m["cached_ratio"]),
                  f"{_pct(m['device_cached_ratio'])} / {_pct(m['host_cached_ratio'])}",
                  _pct(m["predicted_cached_ratio"]), _pct(m["prediction_accuracy"]),
                  _dur(m["ttft_p50_s"]), _dur(m["ttft_p99_s"]))
    return t


def _replicas_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="Replicas (load now)", title_justify="left")
    for col in ("model", "replica", "ongoing requests", "queued prefill tokens"):
        t.add_column(col, justify="left" if col in ("model", "replica") else "right")
    for name, m in data["models"].items():
        for replica, r in m["replicas"].items():
            t.add_row(name, replica, _num(r["ongoing_requests"]),
                      _num(r["queued_prefill_tokens"]))
    if not t.rows:
        t.add_row("–", "no replica load reported yet", "", "")
    return t


def _index_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    ix = data["index"]
    t = Table(title="Prefix index and routing", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    entries = _num(ix["entries"]) if ix["entries"] is not None else f"[dim]{ix['entries_note']}[/]"
    errors = ", ".join(f"{op}: {_num(n)}" for op, n in sorted(ix["errors"].items()) if n)
    t.add_row("entries (block, replica)", entries)
    t.add_row("lookups", _num(ix["lookups"]))
    t.add_row("lookup p50 / p99", f"{_dur(ix['lookup_p50_s'])} / {_dur(ix['lookup_p99_s'])}")
    t.add_row("route decision p50 / p99", f"{_dur(ix['route_p50_s'])} / {_dur(ix['route_p99_s'])}")
    t.add_row("index errors", f"[red]{errors}[/]" if errors else "none")
    return t


def render(data: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    # Piped output (a file, grep, CI log) is not squeezed to 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    colour = "green" if data["status"] == "ok" else "red"
    console.print(f"kvroute at [bold]{data['url']}[/]: [{colour}]{data['status']}[/]")
    console.print(_models_table(data))
    console.print(_replicas_table(data))
    console.print(_index_table(data))
    console.print("[dim]counters and latency quantiles are cumulative since the routers "
                  "started; quantiles are estimated from histogram buckets; cached ratios "
                  "are cached / prompt tokens[/]")


def cmd_status(args: argparse.Namespace) -> int:
    """0: healthy; 1: unreachable (or not kvroute); 2: answering but not every model ready."""
    try:
        data = status_data(args.url, timeout_s=args.timeout)
    except StatusError as e:
        sys.stderr.write(f"kvroute status: {e}\n")
        return 1
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        render(data)
    return 0 if data["status"] == "ok" else 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status", help="models, replicas, load, index and cache hit rates of a running kvroute",
        description=cmd_status.__doc__,
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"kvroute base URL (default {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout in seconds")
    p.set_defaults(func=cmd_status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvroute")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["status", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
