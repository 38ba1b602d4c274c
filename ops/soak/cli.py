"""``kvroute soak``: a long mixed workload against a running kvroute, watching for leaks.

Load: ``--concurrency`` closed-loop httpx workers (seeded) send OpenAI chat and
completions and Anthropic messages, streamed and not, and count_tokens; half of them
continue shared-prefix conversations (``x-session-id``), the rest are fresh prompts.
A non-200, a transport error, an error event or a malformed reply is an error.

Every ``--interval`` it samples the Ray processes serving ``--url`` (the raylet above
the process listening on its port, everything under it, the cluster's daemons; or
``--pids``): summed RSS, open fds, per-process RSS; Redis ``used_memory`` and keys;
the interval's latency percentiles. Growth per hour is the least-squares slope after
``--fit-from`` of the run (default: the second half, past warm-up); a bound fails
when the slope minus two standard errors is over it, so noise cannot fail a short
run and a leak does. Bounds and their reasons: docs/reliability.md. Exit code 1 on
errors over ``--max-error-rate`` (default 0: any), growth over a bound, or no
request done. Ctrl-C stops early and still reports; ``--out`` writes the JSON.
Also ``python -m deploy.cli soak``. ``--stack``: the long soak on its own fleet, with faults
on a schedule (``ops.soak.faults``); ``--workload agent``: the bench's agent sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

import httpx

from . import faults
from .probes import (
    growth_per_hour,
    per_process_growth,
    percentile_ms,
    sample_processes,
    sample_redis,
)
from .workload import Stats, Workload, one_request


async def take_sample(t0: float, stats: Stats, opts: argparse.Namespace, redis: Any) -> dict:
    pids = [*opts.pid_list, *(opts.fleet.extra_pids() if opts.fleet else [])]
    procs = sample_processes(pids, opts.port)  # a few ms: no thread needed
    sample = {"t_s": round(time.monotonic() - t0, 2), **procs, **await sample_redis(redis),
              "requests": sum(stats.requests.values()), "errors": sum(stats.errors.values()),
              "p50_ms": percentile_ms(stats.window, 50), "p99_ms": percentile_ms(stats.window, 99),
              **{f"ttft_p{q}_ms": percentile_ms(stats.ttft, q) for q in (50, 90, 99)}}
    if opts.outcomes is not None:
        sample.update(lost=opts.outcomes.lost, in_flight=opts.outcomes.in_flight)
    stats.window.clear()
    stats.ttft.clear()
    return sample


BOUNDS = {"rss_mb": "max_rss_growth_mb_per_h", "fds": "max_fd_growth_per_h",
          "redis_mb": "max_redis_growth_mb_per_h"}


def verdicts(report: dict[str, Any], opts: argparse.Namespace) -> list[str]:
    """The reasons the run fails (empty: it passed)."""
    out = []
    if report["requests"] == 0:
        out.append("no request completed")
    if report["error_rate"] > opts.max_error_rate:
        out.append(f"error rate {report['error_rate']:.4%} > {opts.max_error_rate:.4%}")
    for key, bound_name in BOUNDS.items():
        bound, fit = getattr(opts, bound_name), report["growth"].get(key)
        if bound is not None and fit and fit["per_h"] - 2 * fit["stderr_per_h"] > bound:
            out.append(f"{key} grows {fit['per_h']:+.1f} ± {2 * fit['stderr_per_h']:.1f}/h "
                       f"> {bound}/h")
    return out


def summarize(samples: list[dict], stats: Stats, opts: argparse.Namespace, t: float) -> dict:
    fit_from = t * opts.fit_from
    total, errors = sum(stats.requests.values()), sum(stats.errors.values())
    report: dict[str, Any] = {
        "url": opts.url, "model": opts.model, "duration_s": round(t, 1),
        "concurrency": opts.concurrency, "interval_s": opts.interval, "fit_from_s": fit_from,
        "requests": total, "requests_per_s": round(total / t, 2) if t > 0 else 0.0,
        "errors": errors, "error_rate": errors / total if total else 0.0,
        "requests_by_kind": dict(stats.requests), "errors_by_kind": dict(stats.errors),
        "error_samples": stats.error_samples,
        "growth": {k: g for k in ("rss_mb", "fds", "redis_mb", "redis_keys", "p50_ms", "p99_ms")
                   if (g := growth_per_hour(samples, k, fit_from))},
        "process_growth_top": per_process_growth(samples, fit_from),
        "bounds": {b: getattr(opts, b) for b in (*BOUNDS.values(), "max_error_rate")},
        "samples": samples,
    }
    report["violations"] = verdicts(report, opts)
    report["passed"] = not report["violations"]
    return report


def print_summary(report: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"kvroute soak: {report['duration_s']} s at concurrency {report['concurrency']}, "
              f"{report['requests']} requests ({report['requests_per_s']}/s), "
              f"{report['errors']} errors ({report['error_rate']:.3%})\n")
    out.write(f"{'metric':<12}{'first':>12}{'last':>12}{'growth/h':>14}{'±2σ':>10}"
              f"{'bound/h':>10}\n")
    bound_of = {k: report["bounds"][v] for k, v in BOUNDS.items()}
    for key, fit in report["growth"].items():
        bound = bound_of.get(key)
        out.write(f"{key:<12}{fit['first']:>12.1f}{fit['last']:>12.1f}{fit['per_h']:>+14.1f}"
                  f"{2 * fit['stderr_per_h']:>10.1f}{'-' if bound is None else bound:>10}\n")
    for name, fit in report["process_growth_top"].items():
        out.write(f"  rss {name}: {fit['last']:.0f} MB, {fit['per_h']:+.1f} MB/h\n")
    if not report["growth"].get("rss_mb"):
        out.write("  no process sampled: run on the Ray head's host, or pass --pids\n")
    for line in report["error_samples"][:5]:
        out.write(f"  error {line}\n")
    out.write(("PASS" if report["passed"] else "FAIL: " + "; ".join(report["violations"]))
              + "\n")
    out.flush()


# --- the run ----------------------------------------------------------------------------

async def _worker(client: httpx.AsyncClient, work: Workload, stats: Stats,
                  stop: asyncio.Event) -> None:
    while not stop.is_set():
        await one_request(client, work, stats)


async def _sampler(t0: float, stats: Stats, opts: argparse.Namespace, redis: Any,
                   samples: list[dict], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append(await take_sample(t0, stats, opts, redis))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.interval)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {opts.api_key}", "x-api-key": opts.api_key} \
        if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.concurrency * 2)
    async with httpx.AsyncClient(base_url=opts.url, timeout=opts.timeout, limits=limits,
                                 headers=headers) as client:
        if not opts.model:
            opts.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        opts.models = opts.models or [opts.model]
        work, stats = Workload(opts.model, opts.max_tokens, opts.seed), Stats()
        samples: list[dict] = []
        stop = asyncio.Event()
        redis = None
        if opts.redis_url:
            import redis.asyncio as aioredis
            redis = aioredis.Redis.from_url(opts.redis_url, socket_timeout=2.0)
        loop, t0 = asyncio.get_running_loop(), time.monotonic()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: stop and report
        loop.call_later(opts.duration, stop.set)
        async with contextlib.AsyncExitStack() as stack:
            if opts.workload == "agent":
                tasks = await faults.agent_tasks(opts, stack, stats, stop)
            else:
                tasks = [asyncio.create_task(_worker(client, work, stats, stop))
                         for _ in range(opts.concurrency)]
            if opts.fleet is not None:
                tasks.append(asyncio.create_task(faults.schedule(opts, t0, stop)))
            await _sampler(t0, stats, opts, redis, samples, stop)
            await asyncio.gather(*tasks)  # in-flight requests finish (bounded by --timeout)
        samples.append(await take_sample(t0, stats, opts, redis))
        if redis is not None:
            await redis.aclose()
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)
    return summarize(samples, stats, opts, time.monotonic() - t0)


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``3m``, ``24h`` or ``3d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(text[-1:].lower())
    return float(text[:-1]) * scale if scale else float(text)


def cmd_soak(args: argparse.Namespace) -> int:
    args.fleet = args.outcomes = args.models = None
    if args.interval is None:  # a long run with faults samples every 5 minutes
        args.interval = 300.0 if args.stack else 5.0
    if args.timeout is None:  # a long run's mlx calls on a loaded machine: see reliability.md
        args.timeout = 300.0 if args.stack else 60.0
    if args.stack:
        with faults.stack(args):
            report = faults.long_report(asyncio.run(run(args)), args, verdicts)
        faults.finish(report, args)
        print_summary(report)
        faults.print_long(report)
        return 0 if report["passed"] else 1
    if args.max_error_rate is None:
        args.max_error_rate = 0.0
    args.pid_list = [int(p) for p in args.pids.split(",") if p] if args.pids else []
    url = httpx.URL(args.url)
    local = url.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
    args.port = (url.port or 80) if local and not args.pid_list else None
    report = asyncio.run(run(args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print_summary(report)
    return 0 if report["passed"] else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("soak", help="long mixed workload; fails on errors or leaks",
                              description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="a running kvroute")
    p.add_argument("--duration", type=duration, default=600.0, help="e.g. 180, 3m, 24h")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--model", help="model to call (default: the first of /v1/models)")
    p.add_argument("--max-tokens", type=int, default=16, help="output limit per request")
    p.add_argument("--redis-url", default=os.environ.get("KVROUTE_REDIS_URL"),
                   help="sample this Redis' INFO memory (default: KVROUTE_REDIS_URL)")
    p.add_argument("--pids", help="comma-separated pids to sample (default: the local Ray "
                   "cluster serving --url)")
    p.add_argument("--interval", type=duration, default=None,
                   help="seconds between samples (default 5; with --stack 5m)")
    p.add_argument("--fit-from", type=float, default=0.5,
                   help="fit growth after this fraction of the run (warm-up before)")
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--max-rss-growth-mb-per-h", type=float, default=64.0)
    p.add_argument("--max-fd-growth-per-h", type=float, default=20.0)
    p.add_argument("--max-redis-growth-mb-per-h", type=float, default=None)
    p.add_argument("--max-error-rate", type=float, default=None,
                   help="0 (the default; --stack: 0.01): any error fails")
    p.add_argument("--timeout", type=float, default=None,
                   help="per-request timeout, s (default 60; with --stack 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", help="when the server has API keys")
    faults.add_arguments(p, duration)
    p.set_defaults(func=cmd_soak)
