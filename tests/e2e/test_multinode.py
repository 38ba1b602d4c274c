"""Two Ray nodes on loopback (``ray.cluster_utils.Cluster``): router and worker
replicas on both nodes share the Redis index, so the same prefix reaches the
same worker replica whichever router replica took the request.

Runs in its own pytest process (``pytest -m multinode``): a Cluster cannot share
a process with the single-node Ray the other tests use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, KvrouteConfig, RouterConfig, ServerConfig
from tests.conftest import free_port
from tests.stacks import redis_url, sim_model

pytestmark = [pytest.mark.slow, pytest.mark.multinode]
MODEL = "sim-multi"


@pytest.fixture(scope="module")
def cluster_stack(tiny_model_dir: Path, stack_redis: Any) -> Iterator[str]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from deploy.serve import runtime

    # One proxy stands in for a load balancer in front of both nodes: let it spread
    # requests over router replicas instead of preferring the one on its own node.
    os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    cluster.add_node(num_cpus=3)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    cfg = KvrouteConfig(
        models=[sim_model(MODEL, tiny_model_dir, replicas=2, num_cpus=0.5,
                          max_replicas_per_node=1)],
        router=RouterConfig(replicas=2, num_cpus=0.5, max_replicas_per_node=1),
        index=IndexConfig(redis_url=redis_url(stack_redis)),
        server=ServerConfig(host="127.0.0.1", port=free_port(), proxy_location="HeadOnly"),
    )
    try:
        url = runtime.deploy(cfg)
        runtime.wait_healthy(url, timeout_s=180)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        os.environ.pop("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", None)


def _chat(url: str, text: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_replicas_span_both_nodes(cluster_stack: str) -> None:
    import time

    worker_nodes, router_nodes = set(), set()
    deadline = time.monotonic() + 30  # routing stats reach routers every second
    while time.monotonic() < deadline and (len(worker_nodes) < 2 or len(router_nodes) < 2):
        info = httpx.get(f"{cluster_stack}/kvroute/replicas", timeout=10).json()
        router_nodes.add(info["router"]["node"])
        worker_nodes |= {r["node"] for r in info["models"][MODEL] if r.get("node")}
        time.sleep(0.2)
    assert len(worker_nodes) == 2, worker_nodes
    assert len(router_nodes) == 2, router_nodes


def test_prefix_reaches_same_worker_via_any_router(cluster_stack: str) -> None:
    routers_seen: set[str] = set()
    for convo in range(6):
        prefix = f"conversation {convo}: " + "shared agent context " * 80
        home = _chat(cluster_stack, prefix).headers["x-kvroute-replica"]
        for turn in range(5):
            r = _chat(cluster_stack, prefix + f" turn {turn}")
            routers_seen.add(r.headers["x-kvroute-router"])
            assert r.headers["x-kvroute-replica"] == home, (convo, turn)
    assert len(routers_seen) == 2, "the requests never crossed both router replicas"
