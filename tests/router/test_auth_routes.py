"""Auth and rate limits at the HTTP layer, in process (FakeCore + TestClient): 401s in each
API's own error shape before the body is read, 429 with retry-after, keys never forwarded."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.auth import ApiKeyConfig, Authenticator, hash_key
from router.ratelimit import RateLimiter
from tests.router.test_anthropic_api import FakeCore, make_client

KEY = "sk-kvr-route-test-key"
CHAT = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


class LimitedCore(FakeCore):
    """FakeCore with keys, admitting through a local RateLimiter like RouterCore does."""

    def __init__(self, model_dir: Path, rpm: int) -> None:
        super().__init__(model_dir)
        self.auth = Authenticator([ApiKeyConfig(name="t", key_sha256=hash_key(KEY),
                                                requests_per_min=rpm)])
        self.limiter = RateLimiter(None)

    async def generate(self, *args, api_key=None, **kw):  # type: ignore[no-untyped-def]
        if api_key is not None:
            await self.limiter.admit(api_key, len(args[1]) + args[2].max_tokens)
        return await super().generate(*args, api_key=api_key, **kw)


@pytest.fixture
def client(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    core = LimitedCore(tiny_model_dir, rpm=2)
    return core, make_client(core)


def test_401_in_each_api_shape_before_the_body(client) -> None:  # type: ignore[no-untyped-def]
    core, c = client
    r = c.post("/v1/chat/completions", content=b"not json")  # no key: 401, not 400
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.json()["error"]["code"] == "missing_api_key"
    r = c.post("/v1/messages", json=CHAT, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["type"] == "error"
    r = c.post("/v1/messages/count_tokens", json=CHAT)
    assert r.status_code == 401
    assert not core.calls


def test_keys_work_limits_apply_and_are_not_forwarded(client) -> None:  # type: ignore[no-untyped-def]
    core, c = client
    ok1 = c.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"})
    ok2 = c.post("/v1/messages", json=CHAT, headers={"x-api-key": KEY})
    assert (ok1.status_code, ok2.status_code) == (200, 200)
    assert all(call["api_key"].name == "t" for call in core.calls)
    assert all(KEY not in str(call["headers"]) for call in core.calls)
    r = c.post("/v1/messages", json=CHAT, headers={"x-api-key": KEY})
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert int(r.headers["retry-after"]) >= 1
    r = c.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
