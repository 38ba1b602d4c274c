"""Pre-warmed scale-out, measured: the new replica's first 60 s with and without pre-warm.

    kvroute bench prewarm --duration 100 --window 60 --rounds 1

Each run deploys one sim model with Serve's default autoscaling (1 to 2 replicas,
``target_ongoing_requests`` 1, a long downscale delay) behind the kvroute router with a
throwaway redis-server index, and drives the agent workload (``ops.bench.harness.workloads``:
shared system prompt and tools, per-session histories, tool and user pauses) closed loop.
The load makes Serve add the second replica within seconds; a watcher records when it
appears in the router's view (``/kvroute/replicas``). Printed per run: the requests the new
replica served in its first ``--window`` seconds, their cached-token ratio and TTFT p50, and
the same over all replicas in that window. Runs alternate pre-warm on and off
(``router.prewarm.enabled``), ``--rounds`` times each, same seed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import numpy as np

from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver
from ops.bench.harness.config import StackSpec, build, sim_kwargs
from ops.bench.harness.procs import redis_server
from ops.bench.harness.workloads import AgentParams, AgentWorkload

MODEL = "prewarm-model"


def build_config(model_path: str, redis_url: str, port: int, *, prewarm: bool,
                 sim: dict[str, float]) -> Any:
    from deploy.config import AutoscalingConfig

    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2, target_ongoing_requests=1.0,
                                upscale_delay_s=1.0, downscale_delay_s=600.0,
                                metrics_interval_s=0.5, look_back_period_s=2.0)
    return build(StackSpec(model=MODEL, model_path=model_path, port=port, replicas=None,
                           autoscaling=scaling, engine_kwargs=sim_kwargs(sim),
                           redis_url=redis_url, prewarm=prewarm))


async def _watch(url: str, runner: Runner, seen: dict[str, float], stop: asyncio.Event) -> None:
    """Each replica id the router lists, with when (run seconds) it first did."""
    async with httpx.AsyncClient(timeout=5) as http:
        while not stop.is_set():
            try:
                models = (await http.get(f"{url}/kvroute/replicas")).json()["models"]
                for rep in models.get(MODEL, []):
                    seen.setdefault(rep["replica"], runner.elapsed)
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            await asyncio.sleep(0.25)


def window_figures(records: list[Record], seen: dict[str, float], window_s: float
                   ) -> dict[str, Any]:
    """The new replica's (the second one listed) first ``window_s`` seconds."""
    if len(seen) < 2:
        return {"new_replica": None}
    new, t_new = sorted(seen.items(), key=lambda kv: kv[1])[1]
    inside = [r for r in records if r.ok and t_new <= r.start_s < t_new + window_s]
    there = [r for r in inside if r.replica == new]

    def figures(rs: list[Record]) -> dict[str, Any]:
        prompt = sum(r.prompt_tokens for r in rs)
        return {"requests": len(rs),
                "cached_ratio": sum(r.cached_tokens for r in rs) / prompt if prompt else None,
                "ttft_p50_s": float(np.median([r.ttft_s for r in rs])) if rs else None}

    return {"new_replica": new, "appeared_s": round(t_new, 2),
            "window_s": round(min(window_s, max(r.start_s for r in records) - t_new), 1),
            "new": figures(there), "new_first5": figures(there[:5]), "all": figures(inside)}


async def _measure(url: str, params: AgentParams, duration_s: float, concurrency: int
                   ) -> tuple[list[Record], dict[str, float]]:
    spec = LoadSpec(duration_s=duration_s, concurrency=concurrency, ramp_s=2.0,
                    seed=params.seed)
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    async with Client(url, MODEL, identity=True) as client:
        runner = Runner(client, spec, "prewarm", show=False)
        watch = asyncio.ensure_future(_watch(url, runner, seen, stop))
        try:
            records = await runner.run(agent_driver(AgentWorkload(params), spec))
        finally:
            stop.set()
            await watch
    return records, seen


def local_runs(configs: Sequence[Callable[[str, int], Any]],
               measure: Callable[[str], Any]) -> Iterator[Any]:
    """Each config (built from the redis URL and the proxy port) deployed in turn on one
    local Ray with one throwaway redis-server (flushed per run), ``measure(url)`` run
    against it, the app deleted; yields each measure's result as it ends."""
    import redis

    from ops.bench.harness.procs import free_port
    from ops.bench.harness.stack import deployed, local_ray

    port = free_port()
    with redis_server() as redis_url, local_ray(num_cpus=6):
        for build in configs:
            redis.Redis.from_url(redis_url).flushall()
            with deployed(build(redis_url, port)) as url:
                result = measure(url)
            yield result


def runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ops.models.tiny_model import ensure_model

    sim = {"kv_blocks": args.kv_blocks, "prefill_tok_s": args.prefill_tok_s,
           "tpot_s": args.tpot_s}
    params = AgentParams(seed=args.seed, compact_tokens=20000)
    path = str(ensure_model())
    order = [on for _ in range(args.rounds) for on in (True, False)]
    builds = [functools.partial(build_config, path, prewarm=on, sim=sim) for on in order]

    def measure(url: str) -> tuple[list[Record], dict[str, float], float]:
        t0 = time.monotonic()
        records, seen = asyncio.run(_measure(url, params, args.duration, args.concurrency))
        return records, seen, time.monotonic() - t0

    out = []
    for on, (records, seen, wall) in zip(order, local_runs(builds, measure), strict=True):
        row = {"prewarm": on, "requests": len(records),
               "errors": sum(not r.ok for r in records), "wall_s": round(wall, 1),
               **window_figures(records, seen, args.window)}
        print(row, flush=True)
        out.append(row)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=100.0, help="Load seconds per run.")
    p.add_argument("--window", type=float, default=60.0,
                   help="Seconds of the new replica's life measured.")
    p.add_argument("--rounds", type=int, default=1, help="On/off pairs, alternated.")
    p.add_argument("--concurrency", type=int, default=8, help="Agent sessions at once.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=2000, help="Sim device blocks.")
    p.add_argument("--prefill-tok-s", type=float, default=20000.0)
    p.add_argument("--tpot-s", type=float, default=0.01)


def run(args: argparse.Namespace) -> int:
    rows = runs(args)
    print("\nprewarm | new replica: requests  cached  TTFT p50 | its first 5: cached  TTFT "
          "p50 | all replicas: cached  TTFT p50")
    for r in rows:
        n, f, a = (r.get(k) or {} for k in ("new", "new_first5", "all"))
        print(f"{'on ' if r['prewarm'] else 'off'}     | {n.get('requests', 0):>8}  "
              f"{_pct(n.get('cached_ratio'))}  {_s(n.get('ttft_p50_s'))} | "
              f"{_pct(f.get('cached_ratio'))}  {_s(f.get('ttft_p50_s'))} | "
              f"{_pct(a.get('cached_ratio'))}  {_s(a.get('ttft_p50_s'))}")
    return 0


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _s(x: float | None) -> str:
    return "   -   " if x is None else f"{x:6.3f}s"
