"""Two Ray nodes on loopback (``ray.cluster_utils.Cluster``): router and worker
replicas on both nodes share the Redis index, so the same prefix reaches the
same worker replica whichever router replica took the request; and one node lost under
agent load and regained (the node-loss bench, short: last, since it kills a node).

Runs in its own pytest process (``pytest -m multinode``): a Cluster cannot share
a process with the single-node Ray the other tests use."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops.bench import node_loss
from ops.bench.node_loss_figures import invariants_hold, markdown
from tests.conftest import free_port
from tests.stacks import redis_url

pytestmark = [pytest.mark.slow, pytest.mark.multinode]
MODEL = node_loss.MODEL


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    node_loss.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def cluster_stack(tiny_model_dir: Path, stack_redis: Any) -> Iterator[dict[str, Any]]:
    """The node-loss bench's cluster and stack: a router and a sim worker replica on each
    node, the Redis index, Serve's one proxy on the head (a load balancer's stand-in)."""
    from deploy.serve import runtime

    index = redis_url(stack_redis)
    # a 4 s liveness window: the index drops a lost node's replicas sooner than the default 10
    args = _args("--liveness-ttl", "4")
    with node_loss.two_nodes(args.node_cpus) as fleet:
        cfg = node_loss.build_config(args, index, free_port(), str(tiny_model_dir))
        # generous Redis timeouts: the routing test must not fall back to the per-router
        # index because a 50 ms call timed out on a busy machine (CI runs two lanes)
        cfg = cfg.model_copy(update={"index": cfg.index.model_copy(
            update={"timeout_s": 0.5, "op_timeout_s": 1.0})})
        url = runtime.deploy(cfg)
        runtime.wait_healthy(url, timeout_s=300)
        yield {"url": url, "redis_url": index, "fleet": fleet}


def _chat(url: str, text: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_replicas_span_both_nodes(cluster_stack: dict[str, Any]) -> None:
    import time

    url = cluster_stack["url"]
    worker_nodes, router_nodes = set(), set()
    deadline = time.monotonic() + 30  # routing stats reach routers every second
    while time.monotonic() < deadline and (len(worker_nodes) < 2 or len(router_nodes) < 2):
        info = httpx.get(f"{url}/kvroute/replicas", timeout=10).json()
        router_nodes.add(info["router"]["node"])
        worker_nodes |= {r["node"] for r in info["models"][MODEL] if r.get("node")}
        time.sleep(0.2)
    assert len(worker_nodes) == 2, worker_nodes
    assert len(router_nodes) == 2, router_nodes


def test_prefix_reaches_same_worker_via_any_router(cluster_stack: dict[str, Any]) -> None:
    url = cluster_stack["url"]
    routers_seen: set[str] = set()
    for convo in range(6):
        prefix = f"conversation {convo}: " + "shared agent context " * 80
        home = _chat(url, prefix).headers["x-kvroute-replica"]
        for turn in range(5):
            r = _chat(url, prefix + f" turn {turn}")
            routers_seen.add(r.headers["x-kvroute-router"])
            assert r.headers["x-kvroute-replica"] == home, (convo, turn)
    assert len(routers_seen) == 2, "the requests never crossed both router replicas"


def test_a_lost_node_costs_only_its_streams_and_comes_back(
        cluster_stack: dict[str, Any]) -> None:
    """Last (it kills a node): the node-loss bench, short. Agent sessions through both
    routers; at 8 s every process of the second node is SIGKILLed, 6 s later a node joins
    again. Nothing on the surviving node fails, in flight or sent after the kill; the index
    and the routers drop the dead worker replica; Serve places the replacements on the new
    node and routing sends them requests."""
    args = _args("--duration", "30", "--kill-at", "8", "--readd-at", "6", "--concurrency",
                 "6", "--ramp", "2", "--liveness-ttl", "4", "--quiet")
    records, times = node_loss.measure(cluster_stack["url"], cluster_stack["redis_url"],
                                       cluster_stack["fleet"], args)
    res = node_loss.result(records, times, args)
    print("\nNODE LOSS\n" + markdown(res))
    inflight, after = res["in_flight_at_kill"], res["after_kill"]
    assert times.dead_workers and times.dead_routers, "the lost node held no replicas"
    assert inflight["surviving"]["errors"] == 0, inflight["surviving"]["error_samples"]
    assert after["count"] > 0 and after["surviving_errors"] == 0, after["error_samples"]
    # a surviving router's streams on the dead worker resume on the other worker
    assert inflight["dead_worker"]["errors"] == 0, inflight["dead_worker"]["error_samples"]
    assert res["index_drop_s"] is not None and res["router_drop_s"] is not None
    assert res["replaced_s"] is not None, "Serve did not replace the lost replicas"
    assert res["routed_new_s"] is not None, "no request reached a replacement replica"
    assert invariants_hold(res)
