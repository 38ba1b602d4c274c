"""End to end on real parts: Ray Serve on loopback, two mlx-lm CPU replicas of the
tiny model, a real redis-server index, the openai SDK as the client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from deploy.config import ModelConfig
from tests.stacks import deployed, redis_url, shared_index, stack_config

# Two mlx replicas and Redis, as test_agents has, but a stack of its own: the spread tests
# need replicas and a router no other module has loaded (test_agents' sessions, leases and
# kills left one replica preferred, and the spread fell to one replica).
pytestmark = [pytest.mark.slow, pytest.mark.stack("mlx")]
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def stack(
    ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int
) -> Iterator[dict[str, Any]]:
    index = redis_url(stack_redis)
    model = ModelConfig(name=MODEL, engine="mlx", model_path=str(tiny_model_dir),
                        num_replicas=2, num_cpus=0.5)
    with deployed(stack_config(serve_port, model, index=shared_index(stack_redis)),
                  fresh=True,
                  timeout_s=300) as url:
        yield {"url": url, "redis_url": index}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _words(seed: int, n: int) -> str:
    vocab = ["alpha", "river", "stone", "cloud", "tensor", "paper", "orbit", "maple", "delta"]
    return " ".join(vocab[(seed * 7 + i * (seed + 3)) % len(vocab)] + str(i % 13) for i in range(n))


def _chat(client: openai.OpenAI, messages: list[dict[str, str]], **kw: Any) -> Any:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=8, **kw
    )
    return raw.headers, raw.parse()


def test_models_and_health(stack: dict[str, Any]) -> None:
    models = _client(stack["url"]).models.list()
    assert [m.id for m in models.data] == [MODEL]
    card = _client(stack["url"]).models.retrieve(MODEL)  # GET /v1/models/{id}
    assert card.id == MODEL and card.model_extra["max_model_len"] == 32768  # type: ignore[index]
    assert httpx.head(f"{stack['url']}/health").status_code == 200
    health = httpx.get(f"{stack['url']}/health").json()
    assert health["replicas"][MODEL] == 2


def test_chat_plain_and_streamed(stack: dict[str, Any]) -> None:
    client = _client(stack["url"])
    headers, resp = _chat(client, [{"role": "user", "content": "Say something."}])
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.completion_tokens >= 1
    assert headers["x-kvroute-model"] == MODEL
    assert headers["x-kvroute-replica"]
    assert int(headers["x-kvroute-predicted-cached-tokens"]) >= 0
    assert headers["x-request-id"]

    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream please."}], max_tokens=8,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert isinstance(text, str)


def test_turn_two_reuses_turn_one_cache(stack: dict[str, Any]) -> None:
    client = _client(stack["url"])
    turn1 = [{"role": "system", "content": "You are a coding agent. " + _words(1, 300)},
             {"role": "user", "content": "Read the file. " + _words(2, 200)}]
    h1, r1 = _chat(client, turn1)
    reply = r1.choices[0].message.content or ""
    turn2 = turn1 + [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "Now fix it. " + _words(3, 250)}]
    h2, r2 = _chat(client, turn2)
    assert h2["x-kvroute-replica"] == h1["x-kvroute-replica"]
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.8 * r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)
    assert int(h2["x-kvroute-predicted-cached-tokens"]) > 0


def test_conversations_spread_over_replicas(stack: dict[str, Any]) -> None:
    client = _client(stack["url"])
    seen = set()
    for seed in range(10, 16):
        headers, _ = _chat(client, [{"role": "user", "content": _words(seed, 150)}])
        seen.add(headers["x-kvroute-replica"])
    assert len(seen) == 2


def test_concurrent_requests_spread(stack: dict[str, Any]) -> None:
    async def one(c: openai.AsyncOpenAI, seed: int) -> str:
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": _words(seed, 400)}], max_tokens=4
        )
        return raw.headers["x-kvroute-replica"]

    async def run() -> set[str]:
        c = openai.AsyncOpenAI(base_url=f"{stack['url']}/v1", api_key="x", max_retries=0)
        return set(await asyncio.gather(*(one(c, 100 + i) for i in range(6))))

    assert len(asyncio.run(run())) == 2


def test_redis_index_holds_entries(stack: dict[str, Any], tiny_model_dir: Path) -> None:
    from cache_service import RedisPrefixIndex
    from cache_service.hashing import DEFAULT_BLOCK_SIZE, block_hashes, model_salt
    from router.prompt.tokenizer import ChatTokenizer

    messages = [{"role": "user", "content": "index me " + _words(40, 200)}]
    headers, _ = _chat(_client(stack["url"]), messages)
    tok = ChatTokenizer(str(tiny_model_dir))
    hashes = block_hashes(tok.encode(tok.render(messages)), DEFAULT_BLOCK_SIZE, model_salt(MODEL))
    assert len(hashes) >= 2

    async def lookup() -> dict[str, int]:
        index = RedisPrefixIndex(stack["redis_url"], timeout_s=1.0)
        try:
            return (await index.lookup({MODEL: hashes})).get(MODEL, {})
        finally:
            await index.close()

    match = asyncio.run(lookup())
    assert match.get(headers["x-kvroute-replica"]) == len(hashes), match
    keys = [k.decode() for k in redis.Redis.from_url(stack["redis_url"]).scan_iter(count=1000)]
    assert any(k.startswith("{kvroute}:r:") for k in keys)  # hash-tagged, one slot


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("/v1/chat/completions", b"{not json", 400, "invalid_json"),
    ("/v1/chat/completions", b'{"model": "tiny-llama"}', 400, "invalid_request"),
    ("/v1/chat/completions", b'{"model": "tiny-llama", "messages": []}', 400, "invalid_request"),
    ("/v1/chat/completions",
     b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
     400, "invalid_request"),
    ("/v1/chat/completions",
     b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "temperature": 9}',
     400, "invalid_request"),
    ("/v1/chat/completions",
     b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
    ("/v1/chat/completions",  # 40000 tokens over the 32768 window (max_tokens is cut to fit)
     json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "x " * 40000}],
                 "max_tokens": 8}).encode(), 400, "context_length_exceeded"),
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": [1, 99999]}', 400,
     "invalid_token_ids"),
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": []}', 400, "empty_prompt"),
    ("/v1/chat/completions", b"\xff\xfe\x00garbage", 400, "invalid_json"),
])
def test_bad_requests_get_openai_errors(
    stack: dict[str, Any], path: str, body: bytes, status: int, code: str
) -> None:
    r = httpx.post(f"{stack['url']}{path}", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and err["type"]
