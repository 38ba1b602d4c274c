"""Pre-warmed scale-out on real Serve: a sim model that Serve's autoscaler takes from 1 to 2
replicas under load, a real redis-server index.

Every request starts with one long system prompt. When the second replica appears, the
router (router.routing.prewarm) sends it that prompt as a prefill-only request and keeps user
traffic off it meanwhile; so the first user request that reaches the new replica is
already served from its cache (without pre-warm it would prefill the whole prompt: the
new replica's cache starts empty). The Redis index shows the new replica holding the
prefix from the worker's own cache events."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_service import RedisPrefixIndex, settings_of
from deploy.config import AutoscalingConfig, IndexConfig
from tests.stacks import counter, deployed, redis_url, sim_model, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.autoscaling, pytest.mark.load]
MODEL = "sim-prewarm"
SYSTEM = "You are a careful agent. " + " ".join(f"rule{i}" for i in range(400))


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[tuple[str, IndexConfig]]:
    # target 1 ongoing request: 3 clients make Serve add the second replica within seconds;
    # the long downscale delay keeps it for the rest of the test
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2, target_ongoing_requests=1.0,
                                upscale_delay_s=0.5, downscale_delay_s=300.0,
                                metrics_interval_s=0.5, look_back_period_s=2.0)
    model = sim_model(MODEL, tiny_model_dir, autoscaling=scaling, tpot_s=0.02,
                      max_ongoing_requests=8)
    index = IndexConfig(redis_url=redis_url(stack_redis), timeout_s=0.5,
                        namespace=f"warm{uuid.uuid4().hex[:8]}")
    with deployed(stack_config(serve_port, model, index=index)) as url:
        yield url, index


@dataclass
class Reply:
    sent: float
    replica: str
    cached: int


async def _client(http: httpx.AsyncClient, url: str, k: int, until: asyncio.Event,
                  out: list[Reply]) -> None:
    i = 0
    while not until.is_set():
        body = {"model": MODEL, "max_tokens": 30, "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"client {k} task {i}: " + "detail " * 20}]}
        sent = time.monotonic()
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        out.append(Reply(sent, r.headers["x-kvroute-replica"],
                         r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
        i += 1


async def _load_until_warm(url: str, seconds: float) -> tuple[list[Reply], str]:
    """3 clients until a second replica served 3 requests; the replies and that replica."""
    out: list[Reply] = []
    stop = asyncio.Event()
    found: list[str] = []

    async def watch() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            found[:] = sorted({r.replica for r in out} - {out[0].replica}) if out else []
            if found and sum(r.replica == found[0] for r in out) >= 3:
                break
        stop.set()

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(watch(), *(_client(http, url, k, stop, out) for k in range(3)))
    return out, found[0] if found else ""


def test_a_new_replica_serves_its_first_request_from_the_warmed_prefix(
        stack: tuple[str, IndexConfig]) -> None:
    url, index = stack
    replies, new = asyncio.run(_load_until_warm(url, 45.0))
    assert new, f"Serve never added a replica: {len(replies)} replies"
    old = sorted((r for r in replies if r.replica != new), key=lambda r: r.sent)
    there = sorted((r for r in replies if r.replica == new), key=lambda r: r.sent)
    shared = min((r.cached for r in old if r.cached), default=0)  # the system prompt's
    assert shared > 0  # whole blocks (a hit may go a block further into "client k task")
    assert there[0].cached >= shared, [r.cached for r in there]  # warm before it
    assert counter(url, "kvroute_prewarm_requests_total") >= 1

    async def held() -> int:
        redis_index = RedisPrefixIndex(index.redis_url or "", settings_of(index), timeout_s=1)
        try:
            return len(await redis_index.held_blocks(MODEL, new))
        finally:
            await redis_index.close()

    assert asyncio.run(held()) * index.block_size >= shared  # the worker's events say so
    print(f"\nnew replica's first requests: cached {[r.cached for r in there]} tokens "
          f"(the old one's hits: {shared}+); {len(replies)} requests in all")
