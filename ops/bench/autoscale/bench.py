"""``kvroute bench autoscale``: one autoscaled sim model under a bursty open-loop load, with
the kvroute policy or Serve's default, and what users felt and what it cost.

    kvroute bench autoscale --engine sim --policy kvroute --duration 180 --out kv.json
    kvroute bench autoscale --engine sim --policy serve-default --target-ongoing 4 \\
        --duration 180 --out default.json --plot autoscale.png --with kv.json

Arrivals are the Azure LLM inference trace (code, 2023): its timestamps from
``--trace-start`` on, divided by ``--speedup``, each kept with probability ``--sample``
(seeded), so its bursts and lulls keep their shape. Each arrival sends the next call of the
agent workload (``ops.bench.harness.workloads``: ``--sessions`` sessions interleaved, each replaced
by a fresh one when it ends), open loop: a request goes at its time whatever is in flight.

It starts its own redis-server (the shared prefix index, read to measure what each
scale-down throws away: ``ops.bench.autoscale.watch``), a local Ray and the app, and stops
them after. The JSON is the bench JSON plus ``replica_seconds`` (replicas running or
starting, integrated over the load's duration), ``slo_attainment`` (the share of requests,
failed ones counted as misses, whose TTFT is within ``ttft_target_s``), ``ttft_target_s``,
the replica count and TTFT over time, and the scale-downs' cache cost.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ops.bench.harness.client import Client, LoadSpec, Record, Runner
from ops.bench.harness.config import StackSpec, build, sim_kwargs
from ops.bench.harness.report import bench_json
from ops.bench.harness.workloads import AgentParams, AgentWorkload, BenchRequest, Call, Step

MODEL = "autoscale-model"
DEFAULT_TRACE = "../shared/traces/AzureLLMInferenceTrace_code.csv"


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    policy: str = "kvroute"  # or serve-default
    duration_s: float = 180.0
    trace: str = DEFAULT_TRACE
    trace_start_s: float = 170.0  # the trace's first bursts
    speedup: float = 2.0  # trace seconds per bench second
    sample: float = 0.15  # share of trace arrivals sent
    sessions: int = 8  # agent sessions interleaved
    ttft_target_s: float = 2.0  # the SLO the runs are scored on
    policy_ttft_s: float | None = None  # the kvroute policy's own objective (None: the SLO's)
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 2.0  # serve-default's knob
    upscale_delay_s: float = 1.0
    downscale_delay_s: float = 15.0
    metrics_interval_s: float = 1.0
    look_back_period_s: float = 5.0
    startup_s: float = 5.0
    sim: dict[str, float] = field(default_factory=lambda: {
        "prefill_tok_s": 2000.0, "tpot_s": 0.02, "tpot_per_batch_s": 0.0002,
        "kv_blocks": 2048})
    seed: int = 0
    port: int = 0
    prewarm: bool = True  # router.routing.prewarm: new replicas get the hottest prefixes first
    # short agent prompts on a slow emulated prefill: the replicas' prefill, not the router's
    # tokenizing on a shared 2-core machine, sets the TTFT
    agent: AgentParams = field(default_factory=lambda: AgentParams(
        system_tokens=1000, tools=4, repo_tokens=500, tool_result_tokens=600,
        compact_tokens=6000))


def arrivals(spec: AutoscaleSpec) -> list[float]:
    """Send times (s from the start): the trace's, shifted, sped up and thinned."""
    with open(spec.trace, newline="") as f:
        stamps = [dt.datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
                  for row in csv.DictReader(f)]
    t = np.asarray(stamps) - stamps[0] - spec.trace_start_s
    t = t[(t >= 0) & (t < spec.duration_s * spec.speedup)] / spec.speedup
    keep = np.random.default_rng([spec.seed, 0xA2]).random(len(t)) < spec.sample
    return [float(x) for x in t[keep]]


def _flatten(steps: list[Step] | tuple[Call | Any, ...]) -> Iterator[BenchRequest]:
    for step in steps:
        if isinstance(step, Call):
            yield step.request
        else:
            for agent in step.agents:
                yield from _flatten(agent)


def agent_calls(workload: AgentWorkload, sessions: int) -> Iterator[BenchRequest]:
    """The calls of ``sessions`` agent sessions, interleaved; a finished one is replaced."""
    live = [_flatten(workload.session(i)) for i in range(sessions)]
    nxt = sessions
    while True:
        for k in range(sessions):
            req = next(live[k], None)
            while req is None:
                live[k], nxt = _flatten(workload.session(nxt)), nxt + 1
                req = next(live[k], None)
            yield req


def driver(times: list[float], calls: Iterator[BenchRequest]
           ) -> Callable[[Runner], Awaitable[None]]:
    async def drive(runner: Runner) -> None:
        for t, req in zip(times, calls, strict=False):
            await runner.sleep(t - runner.elapsed)
            if runner.expired:
                return
            runner.spawn(runner.call(req))

    return drive


def build_config(spec: AutoscaleSpec, model_path: str, redis_url: str, port: int) -> Any:
    from deploy.config import AutoscalingConfig

    scaling = AutoscalingConfig(
        policy=spec.policy,  # type: ignore[arg-type]
        ttft_target_s=spec.policy_ttft_s or spec.ttft_target_s,
        startup_s=spec.startup_s, min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas, target_ongoing_requests=spec.target_ongoing_requests,
        upscale_delay_s=spec.upscale_delay_s, downscale_delay_s=spec.downscale_delay_s,
        metrics_interval_s=spec.metrics_interval_s, look_back_period_s=spec.look_back_period_s)
    return build(StackSpec(model=MODEL, model_path=model_path, port=port, replicas=None,
                           autoscaling=scaling, engine_kwargs=sim_kwargs(spec.sim),
                           redis_url=redis_url, prewarm=spec.prewarm))


def slo_attainment(records: list[Record], target_s: float) -> float:
    hit = sum(1 for r in records if r.ok and r.ttft_s is not None and r.ttft_s <= target_s)
    return hit / len(records) if records else 0.0


async def _measure(spec: AutoscaleSpec, url: str, redis_url: str,
                   show: bool) -> tuple[list[Record], dict[str, Any]]:
    from cache_service import RedisPrefixIndex
    from cache_service import settings_of as index_settings
    from deploy.config import IndexConfig
    from deploy.serve.runtime import APP_NAME
    from ops.bench.autoscale.watch import Watch

    index = RedisPrefixIndex(redis_url, index_settings(IndexConfig(redis_url=redis_url)), 2.0)
    load = LoadSpec(duration_s=spec.duration_s, seed=spec.seed)
    drive = driver(arrivals(spec), agent_calls(AgentWorkload(spec.agent), spec.sessions))
    watch = Watch(url, MODEL, APP_NAME, index)
    try:
        async with Client(url, MODEL) as client:
            tasks = watch.start()
            records = await Runner(client, load, spec.policy, show).run(drive)
            watch.stop()
            await asyncio.gather(*tasks)
    finally:
        await index.close()
    return records, {"replica_seconds": watch.replica_seconds(spec.duration_s),
                     **watch.summary()}


def run_autoscale(specs: list[AutoscaleSpec], show: bool = True,
                  on_run: Callable[[dict[str, Any]], None] | None = None
                  ) -> list[dict[str, Any]]:
    """Each spec in turn on one Ray cluster and one redis-server (a fresh deployment and a
    flushed index per run); the bench JSON of each, also passed to ``on_run`` as it ends."""
    import redis

    from ops.bench.harness.procs import free_port, redis_server
    from ops.bench.harness.stack import deployed, local_ray
    from ops.models.tiny_model import ensure_model

    # Ray starts its workers at nice 15: on a shared machine any other process (a test
    # run, pip) preempts the router and replicas while the load generator, at nice 0,
    # keeps sending. The stack under test runs at the load generator's priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    port = specs[0].port or free_port()  # Serve's proxy keeps its first port
    out = []
    cpus = max(s.max_replicas for s in specs) + 3
    with redis_server() as redis_url, local_ray(num_cpus=cpus, tries=3):
        for spec in specs:
            redis.Redis.from_url(redis_url).flushall()
            with deployed(build_config(spec, str(ensure_model()), redis_url, port)) as url:
                records, watched = asyncio.run(_measure(spec, url, redis_url, show))
            out.append(_bench(spec, records, watched))
            if on_run is not None:
                on_run(out[-1])
    return out


def _bench(spec: AutoscaleSpec, records: list[Record], watched: dict[str, Any]
           ) -> dict[str, Any]:
    params = {k: v for k, v in asdict(spec).items() if k != "agent"}
    params["agent"] = spec.agent.to_dict()
    bench = bench_json(records, workload="agent@azure-code", policy=label(spec),
                       replicas=spec.max_replicas, params=params)
    bench.update(watched, slo_attainment=slo_attainment(records, spec.ttft_target_s),
                 ttft_target_s=spec.ttft_target_s,
                 peak_replicas=max((n for _, _, n in watched["replicas_over_time"]), default=0),
                 ttft_over_time=[[round(r.start_s, 2), r.ttft_s if r.ok else None]
                                 for r in records])
    return bench


def label(spec: AutoscaleSpec) -> str:
    """``kvroute`` (``kvroute@Ns`` when its objective is not the scored SLO), or
    ``serve-default@T`` with its target_ongoing_requests; ``-noprewarm`` when new replicas
    are not pre-warmed."""
    if spec.policy != "kvroute":
        name = f"{spec.policy}@{spec.target_ongoing_requests:g}"
    elif spec.policy_ttft_s in (None, spec.ttft_target_s):
        name = "kvroute"
    else:
        name = f"kvroute@{spec.policy_ttft_s:g}s"
    return name if spec.prewarm else f"{name}-noprewarm"
