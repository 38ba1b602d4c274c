"""A node lost and regained under agent load, on a two-node local cluster.

    kvroute bench node-loss --concurrency 8 --duration 60 --out node-loss.json

``ray.cluster_utils.Cluster`` on loopback: the head node (the driver, Serve's controller and
its one proxy) and a second node; a router replica and a sim worker replica on each
(``max_replicas_per_node: 1``), the prefix index in a throwaway ``redis-server``. The agent
workload (long shared prefixes, multi-turn sessions) runs closed loop through the proxy. At
``--kill-at`` every process of the second node is SIGKILLed at once (its raylet, workers and
agents: ``kill_node``); at ``--readd-at`` a new node joins and Serve places the replacements
there (one replica per node: nowhere else to go).

Reported (JSON: the bench JSON plus these; ``ops.bench.node_loss_figures`` computes them):

- ``in_flight_at_kill``: requests sent before the kill and not finished by it, by where they
  ran: ``dead_router`` (the killed node's router held the client's stream: it is lost),
  ``dead_worker`` (a surviving router, the killed node's worker: the stream ends with the
  API's error event or resumes on the surviving worker: ``migrated``), ``surviving``; each
  ``{count, errors, migrated}``;
- ``after_kill``: requests sent after the kill: ``{count, errors, surviving_errors}``
  (``surviving_errors``: errors whose router and worker were on the surviving node, or that
  never reached a router: must be 0);
- ``index_drop_s``: kill → the shared index lists none of the dead worker replicas live;
- ``router_drop_s``: kill → a surviving router's view lists none of them;
- ``replaced_s``: re-add → a router sees a replacement worker replica (two again);
- ``serve_healthy_s``: re-add → Serve reports every deployment healthy, all replicas running;
- ``routed_new_s``: re-add → the first request answered by a replacement (a load request, or
  a fresh-prompt probe sent once it is seen);
- ``requests_to_new``: how many load requests the replacements answered by the end;
- ``readd_error``: why the new node did not start, if it did not (the kill's figures stand).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from ops.bench import node_loss_figures as figures
from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver
from ops.bench.harness.workloads import AgentParams, AgentWorkload

MODEL = "node-loss-model"
T = TypeVar("T")


@dataclass
class Fleet:
    """The two-node cluster: its ``Cluster`` and the node that will be lost."""

    cluster: Any
    node: Any
    node_cpus: float


@dataclass
class NodeTimes:
    """Run-clock times (s) and what each node held when it was killed."""

    kill_s: float | None = None
    readd_s: float | None = None
    index_drop_s: float | None = None
    router_drop_s: float | None = None
    replaced_s: float | None = None  # a router sees the replacement worker replica
    serve_healthy_s: float | None = None  # Serve: every deployment healthy, all running
    probe_new_s: float = float("inf")  # a fresh prompt answered by a replacement
    readd_error: str | None = None  # the new node did not start (a saturated machine)
    dead_workers: set[str] = field(default_factory=set)
    dead_routers: set[str] = field(default_factory=set)
    workers_before: set[str] = field(default_factory=set)


@contextlib.contextmanager
def two_nodes(node_cpus: float = 3.0) -> Iterator[Fleet]:
    """A head node and a second node on 127.0.0.1, the driver connected to the head."""
    from ops.bench.harness.stack import bench_env

    bench_env()  # before Ray is imported: its constants read the loopback switch once
    import ray
    from ray.cluster_utils import Cluster
    # One proxy stands in for a load balancer in front of both nodes: it spreads requests
    # over the router replicas instead of preferring the one on its own node.
    os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    cluster = _retried(lambda: Cluster(initialize_head=True,
                                       head_node_args={"num_cpus": node_cpus,
                                                       "include_dashboard": False}))
    try:
        node = _retried(lambda: cluster.add_node(num_cpus=node_cpus))
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield Fleet(cluster, node, node_cpus)
    finally:
        from ray import serve

        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        os.environ.pop("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", None)


def kill_node(fleet: Fleet) -> None:
    """SIGKILL every process of the second node at once (raylet, its workers, its agents),
    then let ``Cluster`` reap them: a node that loses power, not one that drains."""
    import psutil

    raylet = psutil.Process(fleet.node.all_processes["raylet"][0].process.pid)
    procs = [*raylet.children(recursive=True), raylet]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    fleet.cluster.remove_node(fleet.node, allow_graceful=False)


def readd_node(fleet: Fleet) -> None:
    fleet.node = _retried(lambda: fleet.cluster.add_node(num_cpus=fleet.node_cpus))


def _retried(start: Callable[[], T], tries: int = 5) -> T:
    """``start`` again when a node misses Ray's fixed 30 s registration window (a raylet on
    a saturated machine can); the failed node's processes are left to Ray's reaper."""
    for attempt in range(tries):
        try:
            return start()
        except Exception as e:
            if attempt == tries - 1 or "timed out during startup" not in str(e):
                raise
            time.sleep(5)
    raise AssertionError("unreachable")


def build_config(args: argparse.Namespace, redis_url: str, port: int,
                 model_path: str | None = None) -> Any:
    from deploy.config import IndexConfig, KvrouteConfig, RouterConfig, ServerConfig
    from ops.bench.harness.config import sim_kwargs
    from ops.models.tiny_model import ensure_model

    sim = sim_kwargs({"kv_blocks": args.kv_blocks, "prefill_tok_s": args.prefill_tok_s,
                      "tpot_s": args.tpot_s})
    from deploy.config import ModelConfig

    model = ModelConfig(name=MODEL, engine="sim", model_path=model_path or str(ensure_model()),
                        num_replicas=2, num_cpus=0.5, max_replicas_per_node=1,
                        engine_kwargs=sim, context_window=131072, max_ongoing_requests=64)
    index = IndexConfig(redis_url=redis_url, liveness_ttl_s=args.liveness_ttl)
    return KvrouteConfig(
        models=[model], router=RouterConfig(replicas=2, num_cpus=0.5, max_replicas_per_node=1),
        index=index, server=ServerConfig(host="127.0.0.1", port=port, ingress="proxy",
                                         proxy_location="HeadOnly"))


def _view(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/kvroute/replicas", timeout=5).json()  # type: ignore[no-any-return]


def placement(url: str, node_id: str, tries: int = 60) -> tuple[set[str], set[str], set[str]]:
    """(worker replicas on ``node_id``, routers on it, all worker replicas), from the routers'
    own reports (the proxy spreads the calls over both routers)."""
    dead_w, dead_r, workers = set(), set(), set()
    routers: set[str] = set()
    for _ in range(tries):
        info = _view(url)
        routers.add(info["router"]["replica"])
        if info["router"]["node"] == node_id:
            dead_r.add(info["router"]["replica"])
        for rep in info["models"][MODEL]:
            workers.add(rep["replica"])
            if rep.get("node") == node_id:
                dead_w.add(rep["replica"])
        if len(routers) >= 2 and len(workers) >= 2 and dead_w and dead_r:
            break
        time.sleep(0.1)
    return dead_w, dead_r, workers


def _until(pred: Callable[[], bool], timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a probe that fails is "not yet"
            if pred():
                return True
        time.sleep(step_s)
    return False


def _index_live(redis_url: str) -> set[str]:
    from cache_service import IndexSettings, RedisPrefixIndex

    async def live() -> set[str]:
        index = RedisPrefixIndex(redis_url, IndexSettings(), timeout_s=1.0)
        try:
            return await index.live_replicas(MODEL)
        finally:
            await index.close()

    return asyncio.run(live())


def _router_sees(url: str) -> set[str]:
    return {r["replica"] for r in _view(url)["models"][MODEL]}


def _serve_restored() -> bool:
    from ray import serve

    app = serve.status().applications.get("kvroute")
    if app is None or app.status != "RUNNING":
        return False
    return all(d.status == "HEALTHY" and sum(d.replica_states.values()) ==
               d.replica_states.get("RUNNING", 0) for d in app.deployments.values())


def _drops(url: str, redis_url: str, dead: set[str], timeout_s: float = 120.0
           ) -> tuple[float | None, float | None]:
    """Seconds until the index, and a router's view, list none of ``dead`` (None: never)."""
    start, index_s, router_s = time.monotonic(), None, None
    while time.monotonic() - start < timeout_s and (index_s is None or router_s is None):
        with contextlib.suppress(Exception):
            if index_s is None and not _index_live(redis_url) & dead:
                index_s = time.monotonic() - start
        with contextlib.suppress(Exception):  # the proxy may still pick the dead router
            if router_s is None and not _router_sees(url) & dead:
                router_s = time.monotonic() - start
        time.sleep(0.1)
    return index_s, router_s


def lose_and_regain(url: str, redis_url: str, fleet: Fleet, clock: Callable[[], float],
                    args: argparse.Namespace) -> NodeTimes:
    """The timeline, on the main thread (``Cluster.add_node`` sets signal handlers)."""
    t = NodeTimes()
    time.sleep(max(0.0, args.kill_at - clock()))
    t.dead_workers, t.dead_routers, t.workers_before = placement(url, fleet.node.node_id)
    t.kill_s = clock()
    kill_node(fleet)
    t.index_drop_s, t.router_drop_s = _drops(url, redis_url, t.dead_workers)
    time.sleep(max(0.0, t.kill_s + args.readd_at - clock()))
    t.readd_s = clock()
    try:
        readd_node(fleet)
    except Exception as e:  # the kill's figures still count; the return's are None
        t.readd_error = f"{type(e).__name__}: {e}"[:300]
        return t
    if _until(lambda: _replaced(url, t.workers_before), 300, step_s=0.25):
        t.replaced_s = clock() - t.readd_s
    if _until(_serve_restored, 120, step_s=0.25):
        t.serve_healthy_s = clock() - t.readd_s
    t.probe_new_s = _probe_new(url, t.workers_before, clock, 60) - t.readd_s
    return t


def _replaced(url: str, before: set[str]) -> bool:
    """A router sees two worker replicas again, one of them new."""
    seen = _router_sees(url)
    return len(seen) >= 2 and bool(seen - before)


def _probe_new(url: str, before: set[str], clock: Callable[[], float], timeout_s: float
               ) -> float:
    """Fresh prompts (no cached prefix anywhere) until one is answered by a replacement
    replica: when (run clock) it was sent; ``inf`` if none within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    i = 0
    while time.monotonic() < deadline:
        sent = clock()
        i += 1
        body = {"model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": f"probe {i} {time.time_ns()}"}]}
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            if r.status_code == 200 and r.headers.get("x-kvroute-replica") not in before:
                return sent
        time.sleep(0.1)
    return float("inf")


def measure(url: str, redis_url: str, fleet: Fleet, args: argparse.Namespace
            ) -> tuple[list[Record], NodeTimes]:
    """The agent load on its own thread's event loop; the node's timeline on this one."""
    import threading

    spec = LoadSpec(duration_s=args.duration, concurrency=args.concurrency, ramp_s=args.ramp,
                    seed=args.seed)
    params = AgentParams(seed=args.seed, compact_tokens=args.compact_tokens,
                         tool_time_s=args.tool_time_s, user_time_s=args.user_time_s)
    started, out = threading.Event(), {}

    async def load() -> None:
        async with Client(url, MODEL, identity=True) as client:
            runner = Runner(client, spec, "node-loss", show=not args.quiet)
            out["runner"] = runner
            started.set()
            out["records"] = await runner.run(agent_driver(AgentWorkload(params), spec))

    thread = threading.Thread(target=asyncio.run, args=(load(),), daemon=True)
    thread.start()
    started.wait()
    times = lose_and_regain(url, redis_url, fleet, lambda: out["runner"].elapsed, args)
    thread.join()
    return out.get("records", []), times


def result(records: list[Record], t: NodeTimes, args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.harness import report
    from ops.bench.harness.args import command_line

    params = {"command": command_line("node-loss"), "concurrency": args.concurrency,
              "duration_s": args.duration, "kill_at_s": args.kill_at,
              "readd_at_s": args.readd_at, "liveness_ttl_s": args.liveness_ttl,
              "dead_workers": sorted(t.dead_workers), "dead_routers": sorted(t.dead_routers)}
    bench = report.bench_json(records, workload="agent", policy="kvroute", replicas=2,
                              params=params)
    assert t.kill_s is not None and t.readd_s is not None
    return {**bench, **figures.classify(records, t.kill_s, t.dead_workers, t.dead_routers),
            "index_drop_s": _r(t.index_drop_s), "router_drop_s": _r(t.router_drop_s),
            "replaced_s": _r(t.replaced_s), "serve_healthy_s": _r(t.serve_healthy_s),
            "readd_error": t.readd_error,
            **figures.new_replicas(records, t.readd_s, t.workers_before, t.probe_new_s)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, default=8, help="Agent sessions at once.")
    p.add_argument("--duration", type=float, default=60.0, help="Seconds of load.")
    p.add_argument("--kill-at", type=float, default=15.0, help="Kill the second node at S.")
    p.add_argument("--readd-at", type=float, default=10.0,
                   help="Add a node back S seconds after the kill.")
    p.add_argument("--liveness-ttl", type=float, default=10.0, help="index.liveness_ttl_s.")
    p.add_argument("--ramp", type=float, default=3.0, help="Start the sessions over S.")
    p.add_argument("--compact-tokens", type=int, default=20000, help="Agent history cap.")
    p.add_argument("--tool-time-s", type=float, default=0.3, help="Agent tool time.")
    p.add_argument("--user-time-s", type=float, default=1.0, help="Agent user think time.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=4000, help="Sim device blocks.")
    p.add_argument("--prefill-tok-s", type=float, default=50000.0)
    p.add_argument("--tpot-s", type=float, default=0.01)
    p.add_argument("--node-cpus", type=float, default=3.0, help="Ray CPUs of each node.")
    p.add_argument("--out", type=str, help="Write the JSON here.")
    p.add_argument("--quiet", action="store_true", help="No progress bar.")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ops.bench.harness.stack import bench_env

    bench_env()  # before Ray is imported (runtime imports it)
    from deploy.serve import runtime
    from ops.bench.harness import report
    from ops.bench.harness.procs import free_port, redis_server

    with redis_server() as redis_url, two_nodes(args.node_cpus) as fleet:
        url = runtime.deploy(build_config(args, redis_url, free_port()))
        runtime.wait_healthy(url, timeout_s=300)
        records, times = measure(url, redis_url, fleet, args)
        res = result(records, times, args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report.json_text(res) + "\n")
    print(figures.markdown(res))
    return 0 if figures.invariants_hold(res) else 1
