"""Redis goes away under traffic: routing degrades, requests keep succeeding, and
the shared index fills again once Redis is back. Real Ray Serve, real
redis-server (killed and restarted on its port), sim engine replicas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_redis import factories

from deploy.config import IndexConfig
from tests.stacks import counter, deployed, redis_url, report_fault, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-model"
fault_redis = factories.redis_proc(host="127.0.0.1", port=None)


@pytest.fixture(scope="module")
def stack(
    ray_local: None, tiny_model_dir: Path, fault_redis: Any, serve_port: int
) -> Iterator[dict[str, Any]]:
    url = redis_url(fault_redis)
    cfg = stack_config(serve_port, sim_model(MODEL, tiny_model_dir, replicas=2,
                                             prefill_tok_s=200000.0),
                       index=IndexConfig(redis_url=url, timeout_s=0.05))
    with deployed(cfg) as base:
        yield {"url": base, "redis": fault_redis, "redis_url": url}


async def _one(client: httpx.AsyncClient, url: str, i: int) -> tuple[int, float]:
    t = time.monotonic()
    body = {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": f"conversation {i % 5} " + "x y " * 200}]}
    r = await client.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    return r.status_code, time.monotonic() - t


async def _traffic(url: str, seconds: float) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    async with httpx.AsyncClient() as client:
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            out += await asyncio.gather(*(_one(client, url, i + k) for k in range(4)))
            i += 4
    return out


def _index_size(redis_url: str) -> int:
    import redis

    return sum(1 for _ in redis.Redis.from_url(redis_url).scan_iter(count=1000))


def test_requests_survive_redis_outage_and_index_refills(stack: dict[str, Any]) -> None:
    before = asyncio.run(_traffic(stack["url"], 2.0))
    assert before and all(code == 200 for code, _ in before)
    assert _index_size(stack["redis_url"]) > 0

    stack["redis"].stop()
    retries = counter(stack["url"], "kvroute_retries_total")
    during = asyncio.run(_traffic(stack["url"], 4.0))
    assert during and all(code == 200 for code, _ in during), during
    report_fault("Redis down (4 s of 4-way traffic)", len(during), 0,
                 counter(stack["url"], "kvroute_retries_total") - retries,
                 max(t for _, t in during))

    stack["redis"].start()
    import redis

    redis.Redis.from_url(stack["redis_url"]).flushall()  # came back empty: data lost

    after = asyncio.run(_traffic(stack["url"], 3.0))
    assert all(code == 200 for code, _ in after)
    deadline = time.monotonic() + 10
    while _index_size(stack["redis_url"]) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _index_size(stack["redis_url"]) > 0, "the index did not fill again"
