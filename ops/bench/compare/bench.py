"""``kvroute bench compare``: kvroute against other routers over the same replicas.

    kvroute bench compare --engine sim --replicas 4 --workload agent --duration 180 \\
        --out compare.json --plot docs/img

It deploys the worker replicas once, with ``direct_http`` on (each replica also
serves its own OpenAI endpoint, ``router.app.replica_endpoint``) and, on the sim engine,
``vllm_kv_events`` (each replica publishes its KV events in vLLM's ZMQ format,
``workers.engines.sim.vllm_wire``), reads their endpoints from ``GET /kvroute/replicas``, and
runs the same workload through, in turn (``--routers``; ``all`` = every one):

* ``kvroute``: kvroute's router (ingress -> replica; ``--ingress proxy`` adds Serve's proxy);
* ``round-robin``: sglang-router with ``--policy round_robin`` over the endpoints
  (a plain round-robin: sglang-router's own, so both peers share one HTTP stack);
* ``sglang-router``: sglang-router 0.3.2 with ``--policy cache_aware``, default thresholds;
* ``smg``: smg 1.13 ``cache_aware`` (its text tree: its exact index needs gRPC engines);
* ``vllm-router``: vllm-router 0.1.17 ``kv_aware``, fed by the replicas' KV events;
* ``vllm-router-cache-aware``: vllm-router's text tree;
* ``dynamo``: NVIDIA Dynamo 1.6.1's KV router (``--router-mode kv``), fed by the same
  KV events, in a network namespace with a worker shim per replica
  (``ops.bench.compare.dynamo_peer``).

The peers other than sglang-router run from venvs of their own (``ops.bench.compare.peers``);
every flag that changes their routing goes into the JSON (``params.router_flags``).
Per router, also ``cpu_s_per_request`` and ``added_latency_s`` (``ops.bench.harness.lineup``).

Each run uses its own salt at the start of every prompt (``ops.bench.harness.workloads``),
so no run finds the cache warmed by an earlier one: the workload is otherwise
identical. sglang-router is a subprocess in its own process group, stopped after
its run (and on any error). Before the runs, on the idle system, the overheads:

* ``router_overhead_s``: a minimal request (4 prompt tokens, 1 output token, not
  streamed) through kvroute minus the same request straight to a replica's own
  endpoint: p50 - p50 and p99 - p99;
* ``serve_proxy_overhead_s``: a trivial Serve deployment behind Serve's proxy minus
  the same trivial app on a plain uvicorn process (``ops.bench.compare.children.echo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from cache_service.hashing import DEFAULT_BLOCK_SIZE
from ops.bench.compare import peers
from ops.bench.compare.dynamo_peer import DynamoRun
from ops.bench.compare.goals import check_goals, overhead_goal
from ops.bench.harness import lineup
from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver, trace_driver
from ops.bench.harness.config import StackSpec, build, sim_kwargs
from ops.bench.harness.procs import Subprocess, free_port
from ops.bench.harness.report import bench_json, stats
from ops.bench.harness.tail import tail_fields
from ops.bench.harness.workloads import AgentParams, AgentWorkload, trace_requests

if TYPE_CHECKING:
    from deploy.config import KvrouteConfig

ROUTERS = ("kvroute", "round-robin", "sglang-router", "smg", "vllm-router",
           "vllm-router-cache-aware", "dynamo")
# Token-id prompts on /v1/completions (the trace replay): sglang-router 0.3.2 refuses them
# (422), smg 1.13 too (400; it takes ids only on its native /generate, not driven here).
TOKEN_ID_ROUTERS = ("kvroute", "vllm-router", "vllm-router-cache-aware", "dynamo")
SGLANG_POLICY = {"round-robin": "round_robin", "sglang-router": "cache_aware"}
MODEL = "bench-model"
__all__ = ["MODEL", "ROUTERS", "CompareSpec", "Subprocess", "run_compare"]


@dataclass(frozen=True, slots=True)
class CompareSpec:
    engine: str = "sim"
    replicas: int = 4
    load: LoadSpec = field(default_factory=lambda: LoadSpec(duration_s=180.0, concurrency=20))
    agent: AgentParams = field(default_factory=AgentParams)
    model_path: str | None = None  # default: the tiny offline model
    port: int = 0  # kvroute's HTTP port; 0 = a free one
    ingress: str = "auto"  # kvroute's server.ingress: auto (direct here) | proxy | direct
    stream_interval_ms: float | None = None  # the model's stream pacing; None: its default
    sim: dict[str, float] = field(default_factory=lambda: {
        "prefill_tok_s": 4000.0, "tpot_s": 0.02, "tpot_per_batch_s": 0.0002,
        "kv_blocks": 4096})
    context_window: int = 131072
    max_ongoing_requests: int = 256
    overhead_samples: int = 300
    routers: tuple[str, ...] = ROUTERS
    pause_s: float = 5.0  # idle time between runs
    sglang_args: tuple[str, ...] = ()  # extra sglang-router flags (cache_aware run only)
    event_block_size: int = 16  # the replicas' vLLM-format KV events (vllm-router kv_aware)
    # sim replicas publish those events (EXACT_PEERS route from them); a bench without
    # those peers turns them off: encoding them is work on the replica's loop
    peer_kv_events: bool = True
    trace: str | None = None  # a Mooncake trace: replayed as token ids instead of agent
    vocab_size: int = 4096  # trace: token ids below this
    max_context: int | None = None  # trace: leave out longer requests
    idle_samples: int = 100  # per router: minimal requests on the idle system


def stack_spec(spec: CompareSpec, model_path: str, port: int) -> StackSpec:
    """The replicas every router runs over: direct endpoints on, and on the sim engine its
    KV events in vLLM's format (``EXACT_PEERS`` route from them)."""
    events = spec.engine == "sim" and spec.peer_kv_events
    return StackSpec(
        model=MODEL, model_path=model_path, port=port, engine=spec.engine,
        replicas=spec.replicas, num_cpus=0.5, direct_http=True, ingress=spec.ingress,
        engine_kwargs=sim_kwargs(spec.sim) if spec.engine == "sim" else {},
        context_window=spec.context_window, max_ongoing_requests=spec.max_ongoing_requests,
        kv_event_block_size=spec.event_block_size if events else None,
        stream_interval_ms=spec.stream_interval_ms)


def build_config(spec: CompareSpec, model_path: str, port: int) -> KvrouteConfig:
    return build(stack_spec(spec, model_path, port))


async def replica_endpoints(url: str, n: int, timeout_s: float = 120.0) -> list[str]:
    """The direct endpoints of the model's replicas, once all ``n`` report one."""
    return [h for h, _ in await replica_info(url, n, timeout_s)]


async def replica_info(url: str, n: int, timeout_s: float = 120.0
                       ) -> list[tuple[str, str | None]]:
    """(direct endpoint, vLLM-format KV-event endpoint or None) of each replica, sorted,
    once all ``n`` report a direct endpoint."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/kvroute/replicas") as r:
                data = await r.json() if r.status == 200 else {}
            found = sorted((f"http://{x['http']}", x.get("kv_events"))
                           for x in data.get("models", {}).get(MODEL, []) if x.get("http"))
            if len(found) >= n:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {n} replicas report a direct endpoint")
            await asyncio.sleep(0.5)


async def direct_headers(url: str) -> dict[str, str]:
    """What a call to a direct endpoint must send: the deployment's token, which the
    router lists in /kvroute/replicas (router.app.replica_endpoint). Peer routers pass the
    client's
    Authorization on to their workers; kvroute without keys ignores it."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/kvroute/replicas") as r:
        token = (await r.json()).get("direct_http_token")
    return {"Authorization": f"Bearer {token}"} if token else {}


def sglang_router(endpoints: list[str], policy: str, model_path: str,
                  extra: tuple[str, ...] = ()) -> Subprocess:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *endpoints,
           "--policy", policy, "--host", "127.0.0.1", "--port", str(port),
           "--model-path", model_path, "--prometheus-port", str(free_port()),
           "--prometheus-host", "127.0.0.1", "--log-level", "warn", *extra]
    base = f"http://127.0.0.1:{port}"
    return Subprocess(f"sglang-{policy}", cmd, f"{base}/v1/models",
                      ready_when=(f"{base}/workers", peers.healthy_workers(len(endpoints))))


def plain_echo() -> Subprocess:
    port = free_port()
    cmd = [sys.executable, "-m", "ops.bench.compare.children.echo", str(port)]
    return Subprocess("echo", cmd, f"http://127.0.0.1:{port}/")


# -- overheads ---------------------------------------------------------------------------
async def measure_overheads(url: str, direct: str, echo_serve: str, echo_plain: str,
                            samples: int, headers: dict[str, str] | None = None
                            ) -> dict[str, Any]:
    """Interleaved, sequential minimal requests on the idle system."""
    body = {"model": MODEL, "prompt": [100, 101, 102, 103], "max_tokens": 1}
    targets = {
        "kvroute": ("POST", f"{url}/v1/completions", body),
        "kvroute_models": ("GET", f"{url}/v1/models", None),  # proxy + ingress, no routing
        "direct": ("POST", f"{direct}/v1/completions", body),
        "serve_echo": ("GET", echo_serve, None),
        "plain_echo": ("GET", echo_plain, None),
    }
    times: dict[str, list[float]] = {k: [] for k in targets}
    async with aiohttp.ClientSession(headers=headers) as s:
        for i in range(samples + 20):  # the first 20 warm connections and caches up
            for name, (method, u, b) in targets.items():
                t = await lineup.timed(s, method, u, b)
                if i >= 20:
                    times[name].append(t)
    lat = {k: stats(v, (50, 90, 99)) for k, v in times.items()}

    def diff(a: str, b: str) -> dict[str, float]:
        return {p: lat[a][p] - lat[b][p] for p in ("p50", "p99")}

    return {"router_overhead_s": diff("kvroute", "direct"),
            "serve_proxy_overhead_s": diff("serve_echo", "plain_echo"),
            "latency_s": lat, "samples": samples}


# -- the runs ----------------------------------------------------------------------------
async def run_one(name: str, target: str, spec: CompareSpec, show: bool,
                  headers: dict[str, str] | None = None) -> tuple[list[Record], dict[str, Any]]:
    params: dict[str, Any] = {
        "target": target, "salt": name, "engine": spec.engine, "load": asdict(spec.load),
        **({"sim": dict(spec.sim)} if spec.engine == "sim" else {}),
        **({"ingress": spec.ingress} if name == "kvroute" else {}),
        "stream_interval_ms": spec.stream_interval_ms,  # None: the model's default
    }
    if spec.trace is None:
        driver = agent_driver(AgentWorkload(spec.agent, salt=name), spec.load)
        params["agent"] = spec.agent.to_dict()
    else:
        items = trace_requests(spec.trace, spec.vocab_size, name, max_context=spec.max_context)
        driver = trace_driver(items, spec.load)
        params.update(trace=spec.trace, vocab_size=spec.vocab_size,
                      max_context=spec.max_context)
    async with Client(target, MODEL, headers=headers) as client:
        records = await Runner(client, spec.load, name, show).run(driver)
    rate = spec.sim.get("prefill_tok_s") if spec.engine == "sim" else None
    bench = bench_json(records, workload="trace" if spec.trace else "agent", policy=name,
                       replicas=spec.replicas, params=params, prefill_tok_s=rate)
    bench.update(tail_fields(records, rate))  # per-request rows, the TTFT tail's split
    return records, bench


async def _compare(spec: CompareSpec, url: str, model_path: str, show: bool
                   ) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    from deploy.serve.runtime import proxy_url
    from ops.bench.compare.children.echo import ECHO_ROUTE

    info = await replica_info(url, spec.replicas)
    endpoints = [h for h, _ in info]
    headers = await direct_headers(url)
    echo_serve = f"{proxy_url()}{ECHO_ROUTE}"  # on Serve's proxy, whatever kvroute's ingress
    async with plain_echo() as echo:
        await _wait_ok(echo_serve)
        overheads = await measure_overheads(url, endpoints[0], echo_serve,
                                            echo.ready_url, spec.overhead_samples, headers)
    benches: dict[str, Any] = {}
    records: dict[str, list[Record]] = {}
    for name in spec.routers:
        await asyncio.sleep(spec.pause_s)
        if name == "kvroute":
            records[name], benches[name] = await measured(
                name, url, endpoints[0], lineup.kvroute_processes(), spec, show, headers)
            continue
        proc, flags = launch(name, info, spec, model_path, headers)
        async with proc:
            records[name], benches[name] = await measured(
                name, proc.base_url, endpoints[0], proc.processes(), spec, show, headers,
                getattr(proc, "bridge_processes", list)())
            if isinstance(proc, DynamoRun):  # counted by its shims: no replica header
                benches[name]["per_replica_requests"] = proc.per_replica_requests()
                benches[name].update(await proc.router_metrics())
        benches[name]["params"].update(router_cmd=proc.cmd[1:], router_flags=flags)
    result = {"routers": benches, **overheads, "endpoints": endpoints, "env": environment(),
              "router_overhead_goal_s": overhead_goal(overheads["serve_proxy_overhead_s"])}
    result["goals"] = check_goals(result)
    return result, records


async def measured(name: str, target: str, direct: str, procs: list[Any], spec: CompareSpec,
                   show: bool, headers: dict[str, str], bridge: list[Any] | None = None
                   ) -> tuple[list[Record], dict[str, Any]]:
    """One router's run with its idle added latency first and its CPU over the run;
    ``headers``: the direct endpoints' token (``direct_headers``); ``bridge``: processes
    that carry the router's traffic but are not the router (Dynamo's namespace relays),
    metered apart."""
    added = await lineup.idle_added_latency(target, direct, MODEL, spec.idle_samples, headers)
    meters = [lineup.CpuMeter(p) for p in (procs, lineup.worker_processes(MODEL), bridge or [])]
    for m in meters:
        m.start()
    records, bench = await run_one(name, target, spec, show, headers)
    meter, workers, relays = meters
    for m in meters:
        m.stop()
    n = max(1, bench["requests"])
    bench.update(meter.summary(bench["requests"]), added_latency_s=added,
                 replica_cpu_s_per_request=workers.seconds / n)
    if bridge:
        bench.update(bridge_cpu_s_per_request=relays.seconds / n,
                     bridge_cpu_s_by_process={k: round(v, 3)
                                              for k, v in relays.per_process.items()})
    return records, bench


def launch(name: str, info: list[tuple[str, str | None]], spec: CompareSpec,
           model_path: str, headers: dict[str, str] | None = None
           ) -> tuple[Subprocess, dict[str, Any]]:
    """The peer router ``name`` over the replicas (not started), and its routing flags;
    ``headers``: the direct endpoints' token (Dynamo's shims call the replicas with it)."""
    endpoints, events = [h for h, _ in info], [e for _, e in info]
    if name == "dynamo":
        token = (headers or {}).get("Authorization", "").removeprefix("Bearer ")
        engine = {"max_num_seqs": spec.max_ongoing_requests}
        if spec.engine == "sim":  # the emulator's blocks are kvroute's canonical ones
            engine["total_kv_blocks"] = (int(spec.sim["kv_blocks"]) * DEFAULT_BLOCK_SIZE
                                         // spec.event_block_size)
        dyn = DynamoRun(name, endpoints, events, model_path, MODEL, spec.event_block_size,
                        token, engine)
        return dyn, dict(dyn.flags)
    if name in SGLANG_POLICY:
        policy = SGLANG_POLICY[name]
        extra = spec.sglang_args if policy == "cache_aware" else ()
        proc = sglang_router(endpoints, policy, model_path, extra)
        return proc, {"--policy": policy, "extra": list(extra)}
    if name == "smg":
        run = peers.smg(name, endpoints, model_path, "cache_aware")
    elif name == "vllm-router":
        run = peers.vllm_router(name, endpoints, events, model_path, "kv_aware",
                                spec.event_block_size)
    elif name == "vllm-router-cache-aware":
        run = peers.vllm_router(name, endpoints, events, model_path, "cache_aware",
                                spec.event_block_size)
    else:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return run.process(), dict(run.flags)


async def _wait_ok(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise TimeoutError(f"{url} not ready")


def run_compare(spec: CompareSpec, show: bool = True
                ) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    """Deploy on the running Ray (``harness.stack.local_ray`` first), run, clean up.

    Returns the result JSON and each run's records (for plots). The kvroute app
    and the echo app are deleted at the end; Ray and Serve keep running.
    """
    from ray import serve

    from ops.bench.compare.children.echo import ECHO_APP, ECHO_ROUTE, EchoDeployment
    from ops.bench.harness.stack import deployed
    from ops.models.tiny_model import ensure_model

    model_path = spec.model_path or str(ensure_model())
    with deployed(build_config(spec, model_path, spec.port or free_port())) as url:
        serve.run(EchoDeployment.bind(), name=ECHO_APP, route_prefix=ECHO_ROUTE,
                  blocking=False)
        try:
            return asyncio.run(_compare(spec, url, model_path, show))
        finally:
            with contextlib.suppress(Exception):  # not deployed: nothing to delete
                serve.delete(ECHO_APP)


def environment() -> dict[str, Any]:
    try:
        import sglang_router.version as sv

        sglang = str(getattr(sv, "__version__", "?"))
    except ImportError:
        sglang = "not installed"
    import ray

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(), "ray": ray.__version__,
        "sglang_router": sglang, "numpy": np.__version__, "peers": dict(peers.VERSIONS),
    }
