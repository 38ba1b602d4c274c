"""KvRequestRouter on real Serve: a killed replica costs no failed request, Serve
replaces it, and the shared index purges the dead replica's entries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_redis import factories

from deploy.config import RouterConfig
from tests.stacks import (
    counter,
    deployed,
    kill_replica,
    report_fault,
    shared_index,
    sim_model,
    stack_config,
)

pytestmark = pytest.mark.slow
MODEL = "sim-rr"
rr_redis = factories.redis_proc(host="127.0.0.1", port=None)


# Serve's gRPC data plane (the default) and Ray actor calls fail differently when a
# replica dies (gRPC UNAVAILABLE vs RayActorError): both must fall back.
@pytest.fixture(scope="module", params=["grpc", "actor"])
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path, rr_redis: Any,
          serve_port: int) -> Iterator[dict[str, Any]]:
    index = shared_index(rr_redis, liveness_ttl_s=3.0)
    cfg = stack_config(serve_port, sim_model(MODEL, tiny_model_dir, replicas=2), index=index,
                       router=RouterConfig(worker_transport=request.param))
    with deployed(cfg) as url:
        yield {"url": url, "redis_url": index.redis_url}


def _chat(url: str, text: str) -> httpx.Response:
    """One turn of the test's conversation, under its session key: the prefix alone (357
    tokens) is worth less than a stale load report, which could send turn 2 elsewhere."""
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                      headers={"x-session-id": "test-request-router"})


def _replicas(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["replicas"].get(MODEL, 0))


async def _live(redis_url: str) -> set[str]:
    from cache_service import RedisPrefixIndex

    index = RedisPrefixIndex(redis_url, timeout_s=1.0)
    try:
        return await index.live_replicas(MODEL)
    finally:
        await index.close()


def test_dead_replica_falls_back_and_is_replaced(stack: dict[str, Any]) -> None:
    url = stack["url"]
    convo = "the conversation whose cache lives on one replica " * 30
    first = _chat(url, convo)
    assert first.status_code == 200
    victim = first.headers["x-kvroute-replica"]
    assert _chat(url, convo).headers["x-kvroute-replica"] == victim  # sticky while alive

    retries = counter(url, "kvroute_retries_total")
    kill_replica(MODEL, victim)  # dead before the next request, not merely asked to die
    after, worst = [], 0.0
    for i in range(10):
        t0 = time.monotonic()
        after.append(_chat(url, convo + f" turn {i}"))
        worst = max(worst, time.monotonic() - t0)
    assert all(r.status_code == 200 for r in after), [r.text for r in after if r.status_code != 200]
    assert all(r.headers["x-kvroute-replica"] != victim for r in after)
    report_fault("worker replica killed (requests after)", len(after), 0,
                 counter(url, "kvroute_retries_total") - retries, worst)

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _replicas(url) < 2:
        time.sleep(0.5)
    assert _replicas(url) == 2, "Serve did not replace the killed replica"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and victim in asyncio.run(_live(stack["redis_url"])):
        time.sleep(0.5)
    assert victim not in asyncio.run(_live(stack["redis_url"])), "dead replica not purged"


def test_workers_report_remaining_prefill_through_serve(stack: dict[str, Any]) -> None:
    """The routing stats the ingress reads carry the report's time, the exact remaining
    prefill and the prefill counters the router learns rates from."""
    url = stack["url"]
    for i in range(4):
        assert _chat(url, f"warm the counters {i} " * 40).status_code == 200
    idle_since = time.time()
    deadline = time.monotonic() + 15  # Serve pushes routing stats every second
    while time.monotonic() < deadline:
        stats = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"][MODEL]
        # every replica has reported since the last request ended (a report taken during
        # a prefill rightly shows it unfinished)
        fresh = all(s.get("stats_time", 0) > idle_since for s in stats)
        if fresh and sum(s.get("prefill_tokens_total", 0) for s in stats) > 0:
            break
        time.sleep(0.5)
    assert sum(s.get("prefill_tokens_total", 0) for s in stats) > 0, stats
    for s in stats:
        assert abs(s["stats_time"] - time.time()) < 10, s  # wall clock, recent
        assert s["remaining_prefill_tokens"] == 0, s  # idle: nothing left to prefill
