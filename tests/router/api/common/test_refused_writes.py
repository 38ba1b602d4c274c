"""A request refused after its prompt was encoded writes nothing to the shared token store
(``router.prompt.store``, a real redis-server): the real ingress app in process, the
scripted core of the API tests behind the real ``RouterCore.generate`` admission, a key
of 20,000 tokens/min, a 32,768-token model whose tokenizer has the Redis level. Before,
the encoding itself queued the write, so a 400 ``context_length_exceeded`` or a 429 left
its prompt in Redis for an hour, charged nothing (the review: +90 MiB from ten 413s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from deploy.config import PromptCacheConfig
from router.prompt import store as ts
from router.prompt.setup import TokenCache
from router.prompt.tokenizer import ChatTokenizer
from router.routing.target import Targets
from tests.router.auth.test_auth_routes import KEY, LimitedCore, ingress_client
from tests.router.prompt.test_token_store import NS, tok_redis, url

__all__ = ["tok_redis", "url"]  # the fixtures this module uses
AUTH = {"authorization": f"Bearer {KEY}"}


def _chat(words: int, max_tokens: int) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": max_tokens, "messages": [
        {"role": "system", "content": "rules " * 200},
        {"role": "user", "content": "word " * words}]}


@pytest.fixture
def served(tiny_model_dir: Path, url: str) -> Iterator[tuple[Any, ChatTokenizer]]:
    core = LimitedCore(tiny_model_dir, tpm=20000, context_window=32768)
    tok = ChatTokenizer(str(tiny_model_dir), TokenCache(PromptCacheConfig(), ts.TokenStore(
        url, NS, ttl_s=600)))
    core.tok, core.targets = tok, Targets(core.config, {"tiny": tok})
    for client in ingress_client(core):
        yield client, tok


def _stored(url: str) -> tuple[int, int]:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(f"{{{NS}}}:tok:*"))
    return len(keys), sum(r.memory_usage(k) or 0 for k in keys)


def test_refused_requests_write_nothing_to_the_token_store(
        served: tuple[Any, ChatTokenizer], url: str) -> None:
    client, tok = served
    assert tok.prompt_cache.store is not None
    refused = [
        ("/v1/chat/completions", _chat(40000, 10), 400),  # the prompt alone fills the window
        ("/v1/chat/completions", _chat(3500, 30000), 429),  # prompt + max_tokens over 20,000/min
        ("/v1/messages", _chat(3500, 30000), 429),
        ("/v1/messages/count_tokens", _chat(40000, 10), 400),
        ("/v1/responses", {"model": "tiny", "input": "word " * 40000}, 400),
    ]
    for path, body, status in refused:
        r = client.post(path, json=body, headers=AUTH)
        assert r.status_code == status, (path, r.text[:300])
    tok.prompt_cache.store.flush()
    keys, size = _stored(url)
    print(f"\ntoken store after {len(refused)} refused requests: {keys} entries, {size} bytes")
    assert keys == 0  # before: an entry per refused prompt
    r = client.post("/v1/chat/completions", json=_chat(3500, 10), headers=AUTH)
    assert r.status_code == 200, r.text[:300]
    tok.prompt_cache.store.flush()
    keys, size = _stored(url)
    print(f"after one admitted request: {keys} entries, {size} bytes")
    assert keys > 0  # an admitted prompt is shared as before
