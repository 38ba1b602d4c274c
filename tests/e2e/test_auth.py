"""Auth and rate limits end to end on real Serve (sim engine, two router replicas, a real
redis-server): 401s in each API's shape, keys from an environment variable that only the
deploying process has (resolved once by the app builder), the operational routes behind a
key, one shared per-key budget across the routers, 429 with retry-after, and no key in any
Ray log."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, RouterConfig
from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from tests.stacks import deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-auth"
ALICE, BOB = f"sk-kvr-e2e-alice-{uuid.uuid4().hex}", f"sk-kvr-e2e-bob-{uuid.uuid4().hex}"
CAROL = f"sk-kvr-e2e-carol-{uuid.uuid4().hex}"  # only in the deploying process's env
CAROL_ENV = f"KVROUTE_E2E_KEYS_{uuid.uuid4().hex[:8].upper()}"
RPM = 20
CHAT = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    # Set after Ray started: its replicas never see it, only the builder in this process.
    os.environ[CAROL_ENV] = f"carol:{hash_key(CAROL)}"
    cfg = stack_config(
        serve_port, sim_model(MODEL, tiny_model_dir, tpot_s=0.001, prefill_tok_s=200000.0),
        index=IndexConfig(redis_url=redis_url(stack_redis),
                          namespace=f"e2eauth{uuid.uuid4().hex[:8]}",
                          # generous: on a loaded CI box a 0.5 s limiter call timed out, fell
                          # back to per-replica buckets and admitted 26 of 20 (fail-open is
                          # test_ratelimit_store's subject, not this one's)
                          timeout_s=2.0),
        router=RouterConfig(replicas=2),
        auth=AuthConfig(api_keys=[
            ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE), requests_per_min=RPM),
            ApiKeyConfig(name="bob", key_sha256=hash_key(BOB), tokens_per_min=2000),
        ], api_keys_env=CAROL_ENV),
    )
    # Behind Serve's proxy, which spreads requests over both routers one by one: this
    # module's subjects (keys and one budget on every router) need both to see a burst. With
    # direct ingress the kernel spreads connections, and a burst's admitted requests all
    # landed on one router once (CI, 2026-12-02).
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"ingress": "proxy"})})
    try:
        with deployed(cfg) as url:  # /health needs no key
            yield url
    finally:
        del os.environ[CAROL_ENV]


def test_401s_in_each_api_shape(stack: str) -> None:
    r = httpx.post(f"{stack}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(f"{stack}/v1/messages", json=CHAT, headers={"x-api-key": "nope"}, timeout=30)
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{stack}/v1/models", timeout=30).status_code == 401
    assert httpx.get(f"{stack}/v1/models", headers={"x-api-key": BOB}, timeout=30).is_success


def test_env_keys_reach_every_router_replica(stack: str) -> None:
    """Each router replica read the variable from its own environment,
    where it is not, so a key configured there was refused (and, with no other key, every
    router ran open)."""
    with httpx.Client(base_url=stack, timeout=30) as client:
        for _ in range(12):  # the proxy spreads these over both router replicas
            r = client.get("/v1/models", headers={"authorization": f"Bearer {CAROL}"})
            assert r.status_code == 200, r.text
            assert client.get("/v1/models").status_code == 401


@pytest.mark.parametrize("path", ["/kvroute/replicas", "/openapi.json"])
def test_operational_routes_need_a_key(stack: str, path: str) -> None:
    """These were open with keys on (replica ids and load; the API map)."""
    r = httpx.get(f"{stack}{path}", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    assert httpx.get(f"{stack}{path}", headers={"x-api-key": "nope"}, timeout=30).status_code == 401
    assert httpx.get(f"{stack}{path}", headers={"x-api-key": BOB}, timeout=30).status_code == 200


def test_health_and_metrics_stay_open_by_design(stack: str) -> None:
    """Load-balancer probes and Prometheus scrapers carry no key (docs/auth.md): /health and
    the merged /metrics (counts and replica ids, no prompt or key; cached ~1 s) stay open."""
    assert httpx.get(f"{stack}/health", timeout=30).status_code == 200
    r = httpx.get(f"{stack}/metrics", timeout=30)
    assert r.status_code == 200 and "# TYPE kvroute_" in r.text
    assert ALICE not in r.text and "alice" not in r.text


async def _burst(url: str, n: int) -> tuple[list[httpx.Response], float]:
    async with httpx.AsyncClient(timeout=60) as client:
        t = time.monotonic()
        rs = await asyncio.gather(*(client.post(
            f"{url}/v1/chat/completions", json=CHAT,
            headers={"authorization": f"Bearer {ALICE}"}) for _ in range(n)))
        return list(rs), time.monotonic() - t


def test_one_budget_across_router_replicas(stack: str) -> None:
    t0 = time.monotonic()
    rs, elapsed = asyncio.run(_burst(stack, 2 * RPM))
    ok = [r for r in rs if r.status_code == 200]
    limited = [r for r in rs if r.status_code == 429]
    assert len(ok) + len(limited) == len(rs), [r.status_code for r in rs]
    refill = int(elapsed / (60 / RPM))  # requests the bucket regained during the burst
    assert RPM <= len(ok) <= RPM + refill, (len(ok), elapsed)
    assert len({r.headers["x-kvroute-router"] for r in ok}) == 2  # both routers admitted some
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    assert limited[0].json()["error"]["code"] == "rate_limit_exceeded"
    # Anthropic's shape of the 429. The bucket regains a request every 60/RPM s, so on a
    # busy machine the next call may find one: send until refused, and bound the admitted
    # total by what the bucket regained since the burst began.
    extra = 0
    for _ in range(RPM):
        r = httpx.post(f"{stack}/v1/messages", json=CHAT, headers={"x-api-key": ALICE},
                       timeout=30)
        if r.status_code != 200:
            break
        extra += 1
    regained = int((time.monotonic() - t0) / (60 / RPM))
    assert len(ok) + extra <= RPM + regained, (len(ok), extra, regained)
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


def test_access_log_and_per_key_metrics(stack: str) -> None:
    """Each API request leaves one access line naming its key (not the
    key), and /metrics counts requests per key ("keyed": names stay out of the open
    /metrics unless auth.key_names_in_metrics)."""
    import ray

    from tests.stacks import counter

    before = counter(stack, "kvroute_key_requests_total")
    rid = f"access-{uuid.uuid4().hex}"
    r = httpx.post(f"{stack}/v1/chat/completions", json=CHAT, timeout=30,
                   headers={"authorization": f"Bearer {CAROL}", "x-request-id": rid})
    assert r.status_code == 200, r.text
    assert counter(stack, "kvroute_key_requests_total") == before + 1
    assert 'kvroute_key_requests_total{key="keyed"' in httpx.get(f"{stack}/metrics").text
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001
    deadline = time.monotonic() + 10
    lines: list[dict[str, Any]] = []
    while not lines and time.monotonic() < deadline:
        time.sleep(0.5)
        lines = [json.loads(line[line.index("{"):]) for f in logs.rglob("*")
                 if f.is_file() and f.stat().st_size < 50 << 20
                 for line in f.read_text(errors="replace").splitlines()
                 if rid in line and '"route": ' in line]
    assert lines and lines[0]["key"] == "carol" and lines[0]["model"] == MODEL, lines
    assert lines[0]["status"] == 200 and lines[0]["output_tokens"] == 3 and lines[0]["replica"]
