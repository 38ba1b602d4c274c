"""KV lifecycle on real Serve: a sim replica with a host tier and leases, a real
redis-server index.

A prefix pushed off the device by other prompts lands in the host tier; the index (Redis)
knows that tier, the router predicts the hit, the engine serves it by reloading, and
``/metrics`` (what ``kvroute status`` reads) counts it as a host-tier hit. A session's
turn carries a lease (``router.routing.leases``): under the same pressure its prefix stays on the
device while an unleased one of the same age goes to host."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, LeaseConfig, RouterConfig
from ops.commands.status import model_summary, parse_metrics
from router.app.metrics_hub import CACHE_S
from tests.stacks import counter, deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-tiers"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, replicas=1)
    model = model.model_copy(update={"engine_kwargs": {
        **model.engine_kwargs, "kv_blocks": 64, "host_kv_blocks": 256,
        "host_reload_tok_s": 1e6, "lease_fraction": 0.75}})
    cfg = stack_config(
        serve_port, model,
        index=IndexConfig(redis_url=redis_url(stack_redis),
                          namespace=f"tier{uuid.uuid4().hex[:8]}", timeout_s=0.5),
        router=RouterConfig(leases=LeaseConfig(enabled=True)),
    )
    with deployed(cfg) as url:
        yield url


def _ask(url: str, text: str, session: str | None = None) -> tuple[httpx.Response, dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60, headers=headers)
    assert r.status_code == 200, r.text
    return r, r.json()["usage"]


def test_evicted_prefix_comes_back_from_the_host_tier(stack: str) -> None:
    import time

    a = _words("a", 500)  # ~30 blocks of 64 tokens (the tiny model's tokenizer)
    _, first = _ask(stack, a)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    for k in range(2):  # two others of ~45 blocks fill the 64-block device: "a" to host
        _ask(stack, _words(f"o{k}x", 500))
    time.sleep(0.3)  # the worker publishes its events every 50 ms
    r, again = _ask(stack, a)
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 25 * 64, again
    assert int(r.headers["x-kvroute-predicted-cached-tokens"]) >= 25 * 64
    time.sleep(CACHE_S + 0.1)
    summary = model_summary(parse_metrics(httpx.get(f"{stack}/metrics").text), MODEL, 1)
    host = summary["host_cached_ratio"]
    assert host is not None and host > 0, summary
    assert summary["device_cached_ratio"] + host == pytest.approx(summary["cached_ratio"])


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_a_leased_session_prefix_stays_on_the_device(stack: str) -> None:
    session = f"agent-{uuid.uuid4().hex}"
    leased, plain = _words("l", 300), _words("p", 150)  # ~17 and ~8 blocks
    renewed = counter(stack, "kvroute_lease_renewals_total")
    # sent with the tool-pause prior (5 s); no tool call, so the reply's end renews it with
    # the user-pause prior (30 s) by a prefill-only request; 48 blocks may lease
    _ask(stack, leased, session=session)
    _ask(stack, plain)
    for k in range(4):  # 4 x ~15 blocks: more than the 47 unleased slots hold
        _ask(stack, _words(f"q{k}x", 150))
    host_before = counter(stack, "kvroute_host_cached_tokens_total")
    _, again = _ask(stack, leased, session=session)
    assert again["prompt_tokens_details"]["cached_tokens"] >= 16 * 64
    assert counter(stack, "kvroute_host_cached_tokens_total") == host_before  # device hit
    _, other = _ask(stack, plain)
    assert other["prompt_tokens_details"]["cached_tokens"] >= 7 * 64
    assert counter(stack, "kvroute_lease_renewals_total") == renewed + 2  # both turns
    assert counter(stack, "kvroute_host_cached_tokens_total") > host_before  # from host
