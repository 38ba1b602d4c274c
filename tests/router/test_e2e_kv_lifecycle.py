"""KV lifecycle on real Serve: sim replicas with a host tier, a real redis-server index.

A prefix pushed off the device by other prompts lands in the host tier; the index (Redis)
knows that tier, the router predicts the hit, the engine serves it by reloading, and
``/metrics`` (what ``kvroute status`` reads) counts it as a host-tier hit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig
from ops.status import model_summary, parse_metrics
from router.metrics_hub import CACHE_S
from tests.stacks import deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-tiers"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, replicas=1)
    model = model.model_copy(update={"engine_kwargs": {
        **model.engine_kwargs, "kv_blocks": 12, "host_kv_blocks": 64,
        "host_reload_tok_s": 1e6}})
    cfg = stack_config(
        serve_port, model,
        index=IndexConfig(redis_url=redis_url(stack_redis),
                          namespace=f"tier{uuid.uuid4().hex[:8]}", timeout_s=0.5),
    )
    with deployed(cfg) as url:
        yield url


def _ask(url: str, text: str) -> tuple[httpx.Response, dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r, r.json()["usage"]


def test_evicted_prefix_comes_back_from_the_host_tier(stack: str) -> None:
    import time

    a = "alpha " + " ".join(f"a{i}" for i in range(500))  # ~8 blocks of 64 tokens
    _, first = _ask(stack, a)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    for k in range(2):  # two other prompts fill the 12-block device: "a" moves to host
        _ask(stack, f"other{k} " + " ".join(f"o{k}x{i}" for i in range(500)))
    time.sleep(0.3)  # the worker publishes its events every 50 ms
    r, again = _ask(stack, a)
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 6 * 64, again
    assert int(r.headers["x-kvroute-predicted-cached-tokens"]) >= 6 * 64
    time.sleep(CACHE_S + 0.1)
    summary = model_summary(parse_metrics(httpx.get(f"{stack}/metrics").text), MODEL, 1)
    host = summary["host_cached_ratio"]
    assert host is not None and host > 0, summary
    assert summary["device_cached_ratio"] + host == pytest.approx(summary["cached_ratio"])
