"""Auth and rate limits end to end on real Serve (sim engine, two router replicas, a real
redis-server): 401s in each API's shape, one shared per-key budget across the routers, 429
with retry-after, and no key in any Ray log."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, RouterConfig
from router.auth import ApiKeyConfig, AuthConfig, hash_key
from tests.stacks import deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-auth"
ALICE, BOB = f"sk-kvr-e2e-alice-{uuid.uuid4().hex}", f"sk-kvr-e2e-bob-{uuid.uuid4().hex}"
RPM = 20
CHAT = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    cfg = stack_config(
        serve_port, sim_model(MODEL, tiny_model_dir, tpot_s=0.001, prefill_tok_s=200000.0),
        index=IndexConfig(redis_url=redis_url(stack_redis),
                          namespace=f"e2eauth{uuid.uuid4().hex[:8]}", timeout_s=0.5),
        router=RouterConfig(replicas=2),
        auth=AuthConfig(api_keys=[
            ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE), requests_per_min=RPM),
            ApiKeyConfig(name="bob", key_sha256=hash_key(BOB), tokens_per_min=2000),
        ]),
    )
    with deployed(cfg) as url:  # /health needs no key
        yield url


def test_401s_in_each_api_shape(stack: str) -> None:
    r = httpx.post(f"{stack}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(f"{stack}/v1/messages", json=CHAT, headers={"x-api-key": "nope"}, timeout=30)
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{stack}/v1/models", timeout=30).status_code == 401
    assert httpx.get(f"{stack}/v1/models", headers={"x-api-key": BOB}, timeout=30).is_success
    assert httpx.get(f"{stack}/metrics", timeout=30).status_code == 200


async def _burst(url: str, n: int) -> tuple[list[httpx.Response], float]:
    async with httpx.AsyncClient(timeout=60) as client:
        t = time.monotonic()
        rs = await asyncio.gather(*(client.post(
            f"{url}/v1/chat/completions", json=CHAT,
            headers={"authorization": f"Bearer {ALICE}"}) for _ in range(n)))
        return list(rs), time.monotonic() - t


def test_one_budget_across_router_replicas(stack: str) -> None:
    rs, elapsed = asyncio.run(_burst(stack, 2 * RPM))
    ok = [r for r in rs if r.status_code == 200]
    limited = [r for r in rs if r.status_code == 429]
    assert len(ok) + len(limited) == len(rs), [r.status_code for r in rs]
    refill = int(elapsed / (60 / RPM))  # requests the bucket regained during the burst
    assert RPM <= len(ok) <= RPM + refill, (len(ok), elapsed)
    assert len({r.headers["x-kvroute-router"] for r in ok}) == 2  # both routers admitted some
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    assert limited[0].json()["error"]["code"] == "rate_limit_exceeded"
    r = httpx.post(f"{stack}/v1/messages", json=CHAT, headers={"x-api-key": ALICE}, timeout=30)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"


def test_token_budget(stack: str) -> None:
    big = {**CHAT, "max_tokens": 5000}
    r = httpx.post(f"{stack}/v1/messages", json=big, headers={"x-api-key": BOB}, timeout=30)
    assert r.status_code == 429 and "retry-after" not in r.headers
    r = httpx.post(f"{stack}/v1/messages", json=CHAT, headers={"x-api-key": BOB}, timeout=30)
    assert r.status_code == 200


def test_keys_never_logged(stack: str) -> None:
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001
    for f in logs.rglob("*"):
        if f.is_file() and f.stat().st_size < 50 << 20:
            text = f.read_bytes()
            assert ALICE.encode() not in text and BOB.encode() not in text, f
