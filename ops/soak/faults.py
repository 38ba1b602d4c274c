"""``kvroute soak --stack``: the long soak on its own fleet (``ops.soak.fleet``), the agent
workload (``ops.soak.agent``) on every model, faults on a schedule, and the long-run report
(``ops.soak.longrun``): per-process slopes extrapolated to 72 h, crashes, requests lost.

    kvroute soak --stack --duration 2h                  # faults every 20 min, samples every 5
    kvroute soak --stack --duration 10m --interval 1m --fault-every 3m --out soak.json

What the report adds to ``kvroute soak``'s: ``calls`` (answered, failed, lost, retried,
in flight at the end), ``faults`` (when, which, the pids killed), ``crashes``,
``process_fits`` (``rss_mb`` and ``fds`` per process), ``extrapolated_72h`` (each of RSS,
fds and Redis memory: the fitted slope, its growth over 72 h and the gate's bound), and
``plot`` (the PNG's path, or why there is none). ``growth`` for RSS and fds is the sum of the
slopes of the processes alive at the end (a killed process's series ends, its replacement's
starts: a sum over all processes would see the kill as a drop), Redis memory's is fitted
after its last restart. It fails on a lost call, a crash, an attempt error rate over
``--max-error-rate`` (default 1% here: faults cost retried attempts) or growth over a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import longrun
from .fleet import FAULTS, MLX_MODEL, fleet, inject
from .workload import Stats


async def agent_tasks(opts: argparse.Namespace, stack: contextlib.AsyncExitStack,
                      stats: Stats, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """``--concurrency`` agent slots over ``opts.models``: a real engine's model gets a
    quarter of them (at least one), the sim models the rest, round robin."""
    from ops.bench.harness.client import Client  # numpy and aiohttp: not for every kvroute
    from ops.bench.harness.workloads import AgentWorkload

    from .agent import Outcomes, params_for, slot

    headers = {"authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
    real = [m for m in opts.models if m == MLX_MODEL]
    sims = [m for m in opts.models if m not in real] or real
    n_real = min(len(real) and max(1, opts.concurrency // 4), opts.concurrency - 1) \
        if sims is not real else 0
    plan = [real[i % len(real)] for i in range(n_real)] + \
        [sims[i % len(sims)] for i in range(opts.concurrency - n_real)]
    opts.outcomes = opts.outcomes or Outcomes()
    tasks = []
    for i, model in enumerate(plan):
        client = await stack.enter_async_context(
            Client(opts.url, model, timeout_s=opts.timeout, headers=headers, identity=True))
        work = AgentWorkload(params_for(model in real, opts.seed + i))
        tasks.append(asyncio.create_task(
            slot(client, work, i, len(plan), stats, opts.outcomes, opts.retries, stop)))
    return tasks


async def schedule(opts: argparse.Namespace, t0: float, stop: asyncio.Event) -> None:
    """The faults in turn, every ``--fault-every``, the first after one interval."""
    kinds = [k for k in opts.faults.split(",") if k]
    n = 0
    while kinds:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.fault_every)
            return
        fault = kinds[n % len(kinds)]
        n += 1
        event = await asyncio.to_thread(inject, opts.fleet, fault, time.monotonic() - t0)
        print(f"soak: fault at {event['t_s']:.0f} s: {fault} (pids {event['pids']})", flush=True)


def long_report(report: dict[str, Any], opts: argparse.Namespace,
                verdicts: Callable[[dict[str, Any], argparse.Namespace], list[str]]
                ) -> dict[str, Any]:
    """The fault-aware figures added to ``report``, and its verdict judged again."""
    samples, fit_from = report["samples"], report["fit_from_s"]
    f, out = opts.fleet, opts.outcomes
    fits = {k: longrun.process_fits(samples, field, fit_from)
            for k, field in (("rss_mb", "per_process"), ("fds", "per_process_fds"))}
    restarts = [e["t_s"] for e in f.faults if e["fault"] == "redis-restart"]
    growth = {"rss_mb": longrun.stack_slope(fits["rss_mb"]),
              "fds": longrun.stack_slope(fits["fds"]),
              "redis_mb": longrun.redis_slope(samples, fit_from, restarts)}
    report["growth"].update({k: v for k, v in growth.items() if v})
    report.update(
        calls={"answered": out.answered, "failed": out.failed, "lost": out.lost,
               "retried": out.retried, "in_flight_at_end": out.in_flight},
        faults=f.faults, crashes=longrun.crashes(samples, f.victims), process_fits=fits,
        extrapolated_72h=longrun.extrapolate(growth),
        collector="rotel" if f.collector else "none: the rotel package is not installed",
        models=list(opts.models))
    report["violations"] = verdicts(report, opts)
    if out.lost or out.in_flight:
        report["violations"].append(f"{out.lost} calls lost, {out.in_flight} unanswered")
    if report["crashes"]:
        report["violations"].append(f"{len(report['crashes'])} processes crashed")
    report["passed"] = not report["violations"]
    return report


@contextlib.contextmanager
def stack(args: argparse.Namespace) -> Iterator[None]:
    """The fleet for the block, with ``args`` pointed at it (URL, models, Redis, pids)."""
    workdir = Path(args.out).parent if args.out else Path(".")
    workdir.mkdir(parents=True, exist_ok=True)
    args.workload, args.pid_list = "agent", []
    if args.max_error_rate is None:
        args.max_error_rate = 0.01
    with fleet(workdir, mlx=not args.no_mlx) as f:
        args.fleet, args.url = f, f.url
        args.port, args.models = int(f.url.rsplit(":", 1)[1]), list(f.models)
        args.model = args.models[0]
        args.redis_url = f.redis.url
        yield


def finish(report: dict[str, Any], args: argparse.Namespace) -> None:
    """The PNG beside the JSON, and the JSON written."""
    png = str(Path(args.out).with_suffix(".png")) if args.out else "soak.png"
    report["plot"] = longrun.plot(report, png) or "none: matplotlib is not installed"
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


def print_long(report: dict[str, Any]) -> None:
    c = report["calls"]
    injected = ", ".join(f"{e['fault']}@{e['t_s']:.0f}s" for e in report["faults"])
    print(f"calls: {c['answered']} answered, {c['failed']} failed, {c['lost']} lost, "
          f"{c['retried']} retried; crashes: {len(report['crashes'])}; faults: {injected}")
    for key, x in report["extrapolated_72h"].items():
        print(f"  72 h: {key} {x['per_h']:+.2f} ± {2 * x['stderr_per_h']:.2f}/h -> "
              f"{x['growth_72h']:+.0f} in 72 h (bound {x['bound_per_h']}/h = "
              f"{x['allowed_72h']:.0f}): {'within' if x['within'] else 'OVER'}")
    print(f"  plot: {report['plot']}; collector: {report['collector']}")


def add_arguments(p: argparse.ArgumentParser, duration: Callable[[str], float]) -> None:
    p.add_argument("--stack", action="store_true", help="deploy the soak's own fleet (Redis, "
                   "collector, sim and mlx models, two direct-ingress routers) and inject "
                   "faults; implies --workload agent")
    p.add_argument("--workload", choices=["mixed", "agent"], default="mixed",
                   help="mixed API requests, or the bench's agent sessions")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"with --stack: the faults, in turn (of {', '.join(FAULTS)})")
    p.add_argument("--fault-every", type=duration, default=1200.0,
                   help="with --stack: seconds between faults (e.g. 20m)")
    p.add_argument("--retries", type=int, default=2, help="agent workload: retries per call "
                   "on a wire failure, 408, 429 or 5xx (the SDKs' max_retries)")
    p.add_argument("--no-mlx", action="store_true", help="with --stack: sim replicas only")
