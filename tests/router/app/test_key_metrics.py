"""Per-key metrics and the access log, through the real telemetry
middleware and authenticator in a small ASGI app: one structured line per API request
(key name, model, replica, status, tokens, latency; never the key or the prompt) and the
``kvroute_key_*`` counters, labelled with key names only when the config says so."""

from __future__ import annotations

import functools
import json
import logging
import uuid

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router import metrics, telemetry
from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from router.errors import ApiError, openai_error
from workers.protocol import Usage

KEY = f"sk-kvr-test-{uuid.uuid4().hex}"
PROMPT = "a secret prompt about the merger"


def _app(auth: Authenticator) -> telemetry.TelemetryMiddleware:
    async def chat(request: Request) -> Response:
        try:
            auth.authenticate(request.headers)
        except ApiError as e:
            return openai_error(e)
        info = telemetry.current()
        info.model, info.replica = "m1", "replica-7"
        telemetry.record_usage(info, Usage(12, 3, 0), 0)
        return JSONResponse({"ok": True}, headers={"x-request-id": "req-42"})

    return telemetry.TelemetryMiddleware(
        Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))


async def _call(auth: Authenticator, key: str | None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=_app(auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={"prompt": PROMPT}, headers=headers)
    return r.status_code


def _authenticator(names_in_metrics: bool, keyed: bool = True) -> Authenticator:
    keys = [ApiKeyConfig(name="alice", key_sha256=hash_key(KEY))] if keyed else []
    auth = Authenticator(keys)
    auth.on_caller = functools.partial(telemetry.identify, names_in_metrics=names_in_metrics)
    return auth


def _count(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == telemetry.ACCESS.name]


async def test_one_access_line_per_request_with_the_key_name_never_the_key(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, telemetry.ACCESS.name)
    auth = _authenticator(names_in_metrics=False)
    assert await _call(auth, KEY) == 200
    assert await _call(auth, None) == 401
    ok, refused = _lines(caplog)
    assert {k: ok[k] for k in ("route", "key", "model", "replica", "status",
                               "prompt_tokens", "output_tokens", "request_id")} == {
        "route": "POST /v1/chat/completions", "key": "alice", "model": "m1",
        "replica": "replica-7", "status": 200, "prompt_tokens": 12, "output_tokens": 3,
        "request_id": "req-42"}
    assert isinstance(ok["latency_s"], float)
    assert (refused["key"], refused["status"]) == ("unauthenticated", 401)
    assert KEY not in caplog.text and PROMPT not in caplog.text


@pytest.mark.parametrize("names", [False, True], ids=["keyed", "names"])
async def test_per_key_counters_use_names_only_when_configured(names: bool) -> None:
    label = "alice" if names else "keyed"
    before = (_count("kvroute_key_requests_total", key=label, model="m1", status="ok"),
              _count("kvroute_key_tokens_total", key=label, model="m1", kind="prompt"),
              _count("kvroute_key_tokens_total", key=label, model="m1", kind="output"))
    assert await _call(_authenticator(names_in_metrics=names), KEY) == 200
    after = (_count("kvroute_key_requests_total", key=label, model="m1", status="ok"),
             _count("kvroute_key_tokens_total", key=label, model="m1", kind="prompt"),
             _count("kvroute_key_tokens_total", key=label, model="m1", kind="output"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 12, 3]


async def test_keys_off_is_anonymous(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, telemetry.ACCESS.name)
    before = _count("kvroute_key_requests_total", key="anonymous", model="m1", status="ok")
    assert await _call(_authenticator(names_in_metrics=True, keyed=False), None) == 200
    assert _lines(caplog)[0]["key"] == "anonymous"
    assert _count("kvroute_key_requests_total", key="anonymous", model="m1",
                  status="ok") == before + 1


async def test_the_access_line_takes_the_request_id_serve_or_the_listener_gave(
        caplog: pytest.LogCaptureFixture) -> None:
    """Serve's proxy and the router's own listener add ``x-request-id`` to the response
    outside the app, after this layer; the access line still names the request's id."""
    from router.app.listener import RequestIds

    caplog.set_level(logging.INFO, telemetry.ACCESS.name)

    async def chat(request: Request) -> Response:
        return JSONResponse({"ok": True})

    app = RequestIds(telemetry.TelemetryMiddleware(
        Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])), "app")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={}, headers={"x-request-id": "turn-9"})
    assert r.headers["x-request-id"] == "turn-9"
    assert [line["request_id"] for line in _lines(caplog)] == ["turn-9"]
