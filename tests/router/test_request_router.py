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

from deploy.config import IndexConfig, KvrouteConfig, ModelConfig, ServerConfig

pytestmark = pytest.mark.slow
MODEL = "sim-rr"
rr_redis = factories.redis_proc(host="127.0.0.1", port=None)


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, rr_redis: Any,
          serve_port: int) -> Iterator[dict[str, Any]]:
    from ray import serve

    from deploy import runtime

    redis_url = f"redis://{rr_redis.host}:{rr_redis.port}/0"
    cfg = KvrouteConfig(
        models=[ModelConfig(name=MODEL, engine="sim", model_path=str(tiny_model_dir),
                            num_replicas=2, num_cpus=0.1,
                            engine_kwargs={"tpot_s": 0.002, "prefill_tok_s": 100000.0})],
        index=IndexConfig(redis_url=redis_url, liveness_ttl_s=3.0),
        server=ServerConfig(host="127.0.0.1", port=serve_port),
    )
    url = runtime.deploy(cfg)
    runtime.wait_healthy(url, timeout_s=120)
    yield {"url": url, "redis_url": redis_url}
    serve.delete(runtime.APP_NAME)


def _chat(url: str, text: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


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
    import ray

    url = stack["url"]
    convo = "the conversation whose cache lives on one replica " * 30
    first = _chat(url, convo)
    assert first.status_code == 200
    victim = first.headers["x-kvroute-replica"]
    assert _chat(url, convo).headers["x-kvroute-replica"] == victim  # sticky while alive

    actor = ray.get_actor(f"SERVE_REPLICA::kvroute#{MODEL}#{victim}", namespace="serve")
    ray.kill(actor, no_restart=True)
    t0 = time.monotonic()
    after = [_chat(url, convo + f" turn {i}") for i in range(10)]
    assert all(r.status_code == 200 for r in after), [r.text for r in after if r.status_code != 200]
    assert all(r.headers["x-kvroute-replica"] != victim for r in after)
    print(f"10 requests after the kill in {time.monotonic() - t0:.2f} s, none failed")

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _replicas(url) < 2:
        time.sleep(0.5)
    assert _replicas(url) == 2, "Serve did not replace the killed replica"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and victim in asyncio.run(_live(stack["redis_url"])):
        time.sleep(0.5)
    assert victim not in asyncio.run(_live(stack["redis_url"])), "dead replica not purged"
