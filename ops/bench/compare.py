"""``kvroute bench compare``: kvroute against other routers over the same replicas.

    kvroute bench compare --engine sim --replicas 4 --workload agent --duration 180 \\
        --out compare.json --plot docs/img

It deploys the worker replicas once, with ``direct_http`` on (each replica also
serves its own OpenAI endpoint, ``router.direct_http``), reads their endpoints
from ``GET /kvroute/replicas``, and runs the same workload through, in turn:

* ``kvroute``: kvroute's router (Serve proxy -> ingress -> replica);
* ``round-robin``: sglang-router with ``--policy round_robin`` over the endpoints
  (a plain round-robin: sglang-router's own, so both peers share one HTTP stack);
* ``sglang-router``: sglang-router with ``--policy cache_aware``, default thresholds.

Each run uses its own salt at the start of every prompt (``ops.bench.workloads``),
so no run finds the cache warmed by an earlier one: the workload is otherwise
identical. sglang-router is a subprocess in its own process group, stopped after
its run (and on any error). Before the runs, on the idle system, the overheads:

* ``router_overhead_s``: a minimal request (4 prompt tokens, 1 output token, not
  streamed) through kvroute minus the same request straight to a replica's own
  endpoint: p50 - p50 and p99 - p99;
* ``serve_proxy_overhead_s``: a trivial Serve deployment behind Serve's proxy minus
  the same trivial app on a plain uvicorn process (``ops.bench.echo``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from ops.bench.client import Client, LoadSpec, Record, Runner, agent_driver
from ops.bench.report import bench_json, stats
from ops.bench.workloads import AgentParams, AgentWorkload

ROUTERS = ("kvroute", "round-robin", "sglang-router")
SGLANG_POLICY = {"round-robin": "round_robin", "sglang-router": "cache_aware"}
MODEL = "bench-model"


@dataclass(frozen=True, slots=True)
class CompareSpec:
    engine: str = "sim"
    replicas: int = 4
    load: LoadSpec = field(default_factory=lambda: LoadSpec(duration_s=180.0, concurrency=20))
    agent: AgentParams = field(default_factory=AgentParams)
    model_path: str | None = None  # default: the tiny offline model
    port: int = 0  # Serve's HTTP port; 0 = a free one
    sim: dict[str, float] = field(default_factory=lambda: {
        "prefill_tok_s": 4000.0, "tpot_s": 0.02, "tpot_per_batch_s": 0.0002,
        "kv_blocks": 4096})
    context_window: int = 131072
    max_ongoing_requests: int = 256
    overhead_samples: int = 300
    routers: tuple[str, ...] = ROUTERS
    pause_s: float = 5.0  # idle time between runs
    sglang_args: tuple[str, ...] = ()  # extra sglang-router flags (cache_aware run only)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_config(spec: CompareSpec, model_path: str, port: int) -> Any:
    from deploy.config import KvrouteConfig, ModelConfig, ServerConfig

    kwargs: dict[str, int | float | str | bool] = {}
    if spec.engine == "sim":
        kwargs = {k: int(v) if k == "kv_blocks" else float(v) for k, v in spec.sim.items()}
    model = ModelConfig(
        name=MODEL, engine=spec.engine, model_path=model_path,  # type: ignore[arg-type]
        num_replicas=spec.replicas, num_cpus=0.5, engine_kwargs=kwargs, direct_http=True,
        context_window=spec.context_window, max_ongoing_requests=spec.max_ongoing_requests,
    )
    return KvrouteConfig(models=[model], server=ServerConfig(host="127.0.0.1", port=port))


async def replica_endpoints(url: str, n: int, timeout_s: float = 120.0) -> list[str]:
    """The direct endpoints of the model's replicas, once all ``n`` report one."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/kvroute/replicas") as r:
                data = await r.json() if r.status == 200 else {}
            found = sorted(x["http"] for x in data.get("models", {}).get(MODEL, [])
                           if x.get("http"))
            if len(found) >= n:
                return [f"http://{a}" for a in found]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {n} replicas report a direct endpoint")
            await asyncio.sleep(0.5)


class Subprocess:
    """A server we start, in its own process group, stopped by its own pid."""

    def __init__(self, name: str, cmd: list[str], ready_url: str) -> None:
        self.name, self.cmd, self.ready_url = name, cmd, ready_url
        self.log = Path(tempfile.mkstemp(prefix=f"kvroute-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Fork and exec (quick); readiness is awaited by ``__aenter__``."""
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    async def __aenter__(self) -> Subprocess:
        self.start()
        try:
            await self._wait_ready(60.0)
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.tail()}")
                try:
                    async with s.get(self.ready_url) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)  # its own group: only what we started
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)


def sglang_router(endpoints: list[str], policy: str, model_path: str,
                  extra: tuple[str, ...] = ()) -> Subprocess:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *endpoints,
           "--policy", policy, "--host", "127.0.0.1", "--port", str(port),
           "--model-path", model_path, "--prometheus-port", str(free_port()),
           "--prometheus-host", "127.0.0.1", "--log-level", "warn", *extra]
    return Subprocess(f"sglang-{policy}", cmd, f"http://127.0.0.1:{port}/v1/models")


def plain_echo() -> Subprocess:
    port = free_port()
    cmd = [sys.executable, "-m", "ops.bench.echo", str(port)]
    return Subprocess("echo", cmd, f"http://127.0.0.1:{port}/")


# -- overheads ---------------------------------------------------------------------------
async def _timed(s: aiohttp.ClientSession, method: str, url: str,
                 body: dict[str, Any] | None) -> float:
    start = time.perf_counter()
    async with s.request(method, url, json=body) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return time.perf_counter() - start


async def measure_overheads(url: str, direct: str, echo_serve: str, echo_plain: str,
                            samples: int) -> dict[str, Any]:
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
    async with aiohttp.ClientSession() as s:
        for i in range(samples + 20):  # the first 20 warm connections and caches up
            for name, (method, u, b) in targets.items():
                t = await _timed(s, method, u, b)
                if i >= 20:
                    times[name].append(t)
    lat = {k: stats(v, (50, 90, 99)) for k, v in times.items()}

    def diff(a: str, b: str) -> dict[str, float]:
        return {p: lat[a][p] - lat[b][p] for p in ("p50", "p99")}

    return {"router_overhead_s": diff("kvroute", "direct"),
            "serve_proxy_overhead_s": diff("serve_echo", "plain_echo"),
            "latency_s": lat, "samples": samples}


# -- the runs ----------------------------------------------------------------------------
async def run_one(name: str, target: str, spec: CompareSpec, show: bool
                  ) -> tuple[list[Record], dict[str, Any]]:
    workload = AgentWorkload(spec.agent, salt=name)
    async with Client(target, MODEL) as client:
        records = await Runner(client, spec.load, name, show).run(
            agent_driver(workload, spec.load))
    params: dict[str, Any] = {
        "target": target, "salt": name, "engine": spec.engine, "load": asdict(spec.load),
        "agent": spec.agent.to_dict(),
        **({"sim": dict(spec.sim)} if spec.engine == "sim" else {}),
    }
    rate = spec.sim.get("prefill_tok_s") if spec.engine == "sim" else None
    bench = bench_json(records, workload="agent", policy=name, replicas=spec.replicas,
                       params=params, prefill_tok_s=rate)
    return records, bench


async def _compare(spec: CompareSpec, url: str, model_path: str, show: bool
                   ) -> tuple[dict[str, Any], dict[str, list[Record]]]:
    from ops.bench.echo import ECHO_ROUTE

    endpoints = await replica_endpoints(url, spec.replicas)
    async with plain_echo() as echo:
        await _wait_ok(f"{url}{ECHO_ROUTE}")
        overheads = await measure_overheads(url, endpoints[0], f"{url}{ECHO_ROUTE}",
                                            echo.ready_url, spec.overhead_samples)
    benches: dict[str, Any] = {}
    records: dict[str, list[Record]] = {}
    for name in spec.routers:
        await asyncio.sleep(spec.pause_s)
        if name == "kvroute":
            records[name], benches[name] = await run_one(name, url, spec, show)
            continue
        policy = SGLANG_POLICY[name]
        extra = spec.sglang_args if policy == "cache_aware" else ()
        async with sglang_router(endpoints, policy, model_path, extra) as proc:
            target = proc.ready_url.rsplit("/v1/", 1)[0]
            records[name], benches[name] = await run_one(name, target, spec, show)
            benches[name]["params"]["router_cmd"] = proc.cmd[1:]
    result = {"routers": benches, **overheads, "endpoints": endpoints, "env": environment(),
              "router_overhead_goal_s": overhead_goal(overheads["serve_proxy_overhead_s"])}
    result["goals"] = check_goals(result)
    return result, records


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
    """Deploy on the running Ray (``deploy.runtime.init_ray`` first), run, clean up.

    Returns the result JSON and each run's records (for plots). The kvroute app
    and the echo app are deleted at the end; Ray and Serve keep running.
    """
    from ray import serve

    from deploy import runtime
    from ops.bench.echo import ECHO_APP, ECHO_ROUTE, EchoDeployment
    from ops.tiny_model import ensure_model

    model_path = spec.model_path or str(ensure_model())
    port = spec.port or free_port()
    url = runtime.deploy(build_config(spec, model_path, port))
    try:
        serve.run(EchoDeployment.bind(), name=ECHO_APP, route_prefix=ECHO_ROUTE,
                  blocking=False)
        runtime.wait_healthy(url, timeout_s=300)
        return asyncio.run(_compare(spec, url, model_path, show))
    finally:
        for app in (ECHO_APP, runtime.APP_NAME):
            try:
                serve.delete(app)
            except Exception:  # not deployed: nothing to delete
                pass


# -- verdicts ----------------------------------------------------------------------------
# Router overhead goal, relative to Serve's own proxy overhead measured beside it: kvroute's
# path has two Serve hops a direct call does not (proxy -> ingress, ingress -> worker), each
# costing about one proxy overhead, plus a budget for kvroute's own work (parse, hash, index
# lookup, score) of 3 ms at p50 and 10 ms at p99.
OVERHEAD_HOPS, OVERHEAD_BUDGET_P50_S, OVERHEAD_BUDGET_P99_S = 2.0, 0.003, 0.010


def overhead_goal(proxy: dict[str, float]) -> dict[str, float]:
    return {"p50": OVERHEAD_HOPS * proxy["p50"] + OVERHEAD_BUDGET_P50_S,
            "p99": OVERHEAD_HOPS * proxy["p99"] + OVERHEAD_BUDGET_P99_S}


def check_goals(result: dict[str, Any]) -> dict[str, bool]:
    r = result["routers"]
    goal, overhead = overhead_goal(result["serve_proxy_overhead_s"]), result["router_overhead_s"]
    goals: dict[str, bool] = {
        "zero_errors": all(b["errors"] == 0 for b in r.values()),
        "all_served": all(b["requests"] > 0 for b in r.values()),
        "overhead_p50": overhead["p50"] <= goal["p50"],
        "overhead_p99": overhead["p99"] <= goal["p99"],
    }
    if "kvroute" in r and "round-robin" in r:
        goals["p50_vs_round_robin"] = (
            r["kvroute"]["ttft_s"]["p50"] <= 0.5 * r["round-robin"]["ttft_s"]["p50"])
    if "kvroute" in r and "sglang-router" in r:
        k, s = r["kvroute"]["ttft_s"], r["sglang-router"]["ttft_s"]
        goals["p50_vs_sglang"] = k["p50"] <= 0.8 * s["p50"]
        goals["p99_vs_sglang"] = k["p99"] <= s["p99"]
    return goals


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
        "sglang_router": sglang, "numpy": np.__version__,
    }
