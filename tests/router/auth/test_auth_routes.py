"""Auth and rate limits on the real ingress app (``router.app.ingress.app``), in process.

The app is the one Serve runs, every route and middleware included; only the servable
Serve binds to each route's ``self`` is ours: its ``RouterCore`` is ``FakeCore`` (scripted
engine) with keys and a local RateLimiter, admitting through the real
``RouterCore.generate`` (charge, refund). So a route added without authentication fails
``test_every_route_needs_a_key_but_the_open_ones``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from router.app import ingress
from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from router.auth.ratelimit import RateLimiter
from router.core import RouterCore
from router.errors import ApiError
from router.routing.selection import RouteRequest
from router.routing.target import Target
from tests.router.api.anthropic.test_anthropic_api import FakeCore, FakeGeneration
from workers.protocol import SamplingParams

KEY = "sk-kvr-route-test-key"
CHAT = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
# Open by design (docs/auth.md): load balancers' health checks, Prometheus scrapers, the
# version a client checks first (vLLM's /version is open too).
OPEN = {("GET", "/health"), ("HEAD", "/health"), ("GET", "/metrics"), ("GET", "/version")}


class LimitedCore(FakeCore):
    """FakeCore with keys, admitting through ``RouterCore.generate`` itself."""

    def __init__(self, model_dir: Path, rpm: int | None = None, tpm: int | None = None,
                 context_window: int = 4096) -> None:
        super().__init__(model_dir, context_window=context_window)
        self.auth = Authenticator([ApiKeyConfig(name="t", key_sha256=hash_key(KEY),
                                                requests_per_min=rpm, tokens_per_min=tpm)])
        self.limiter = RateLimiter(None)
        self.isolation = False
        self._tasks: set[Any] = set()
        self._key: ApiKeyConfig | None = None

    def ready(self) -> dict[str, int]:
        return {"tiny": 1}

    refund, _spawn, admit = RouterCore.refund, RouterCore._spawn, RouterCore.admit

    async def generate(self, target: Target, token_ids: list[int],  # type: ignore[override]
                       sampling: SamplingParams, request_id: str,
                       headers: Mapping[str, str] | None = None, session_id: str | None = None,
                       api_key: ApiKeyConfig | None = None,
                       has_tools: bool = False) -> FakeGeneration:
        self._key = api_key
        return await RouterCore.generate(self, target, token_ids,  # type: ignore[arg-type]
                                         sampling, request_id, headers, session_id, api_key,
                                         has_tools)

    async def _generate(self, req: RouteRequest, target: Target) -> FakeGeneration:
        return await FakeCore.generate(self, target, req.token_ids, req.sampling,
                                       req.request_id, req.headers, req.session_id,
                                       self._key, req.has_tools)


class _Metrics:
    async def text(self) -> str:
        return "# metrics\n"


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every API route, also under routers FastAPI (>= 0.137) keeps nested."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            yield from _api_routes(route.original_router.routes)


def _self_dependency() -> Any:
    """The dependency Serve's class-based view gives each route for its ``self``."""
    for route in _api_routes(ingress.app.routes):
        if getattr(route.endpoint, "_serve_cls", None):
            return inspect.signature(route.endpoint).parameters["self"].default.dependency
    raise AssertionError("no Serve class-based route in router.app.ingress.app")


def ingress_client(core: LimitedCore) -> Iterator[TestClient]:
    servable = SimpleNamespace(_core=core, _responses=core.store, _metrics=_Metrics(),
                               _direct_token=None, _replica="test")
    dep = _self_dependency()
    ingress.app.dependency_overrides[dep] = lambda: servable
    ingress.app.state.request_timeout_s = 60.0
    try:
        yield TestClient(ingress.app, raise_server_exceptions=False)
    finally:
        ingress.app.dependency_overrides.pop(dep, None)


@pytest.fixture
def client(tiny_model_dir: Path) -> Iterator[tuple[LimitedCore, TestClient]]:
    core = LimitedCore(tiny_model_dir, rpm=2)
    for c in ingress_client(core):
        yield core, c


def _routes() -> list[tuple[str, str]]:
    return sorted((method, route.path) for route in _api_routes(ingress.app.routes)
                  for method in route.methods)


def test_every_route_needs_a_key_but_the_open_ones(client: tuple[LimitedCore, TestClient]
                                                   ) -> None:
    core, c = client
    routes = _routes()
    assert ("POST", "/v1/chat/completions") in routes and len(routes) >= 10
    for method, path in routes:
        r = c.request(method, path, json=CHAT)
        if (method, path) in OPEN:
            assert r.status_code == 200, (method, path, r.text)
        else:
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            r = c.request(method, path, json=CHAT, headers={"authorization": "Bearer wrong"})
            assert r.status_code == 401, (method, path, r.text)
    assert not core.calls


def test_401_in_each_api_shape_before_the_body(client: tuple[LimitedCore, TestClient]) -> None:
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


def test_keys_work_limits_apply_and_are_not_forwarded(client: tuple[LimitedCore, TestClient]
                                                      ) -> None:
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


def test_a_failed_generation_refunds_its_tokens(tiny_model_dir: Path) -> None:
    """``RouterCore.generate`` charges prompt + max_tokens and refunds all of it when no
    replica serves the request: the key's next request of the same size is admitted."""
    core = LimitedCore(tiny_model_dir, tpm=100)
    body = {**CHAT, "max_tokens": 60}  # ~20 prompt tokens + 60: one fits a minute, not two
    headers = {"authorization": f"Bearer {KEY}"}
    for c in ingress_client(core):
        core.script.error = ApiError(503, "no replica", "no_replica")
        assert c.post("/v1/chat/completions", json=body, headers=headers).status_code == 503
        core.script.error = None
        assert c.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        r = c.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 429, r.text  # the budget is real: this one is over it
