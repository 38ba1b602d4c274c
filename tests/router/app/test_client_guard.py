"""``ClientGuardMiddleware`` on its own: a reply within the deadline passes byte for byte;
past the deadline, a reply not yet started is a 408 in the API's shape, and a stream already
started is cut (no second response start), as Serve's proxy does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.app.client_guard import ClientGuardMiddleware


async def _late(request: Request) -> Response:
    await asyncio.sleep(30)
    return Response(b"never")


async def _stream(request: Request) -> Response:
    stall = request.query_params.get("stall") == "1"

    async def body() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        if stall:
            await asyncio.sleep(30)
        yield b"data: second\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _call(path: str, query: bytes = b"") -> list[dict[str, Any]]:
    """The messages the middleware sends for one GET (a raw ASGI call: a cut stream has no
    end, which an HTTP client would refuse)."""
    app = Starlette(routes=[Route("/v1/late", _late), Route("/v1/s", _stream)])
    app.state.request_timeout_s = 0.3
    app.add_middleware(ClientGuardMiddleware)  # as the ingress adds it: reads app.state
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query, "root_path": "", "headers": [],
             "server": ("t", 80), "client": ("c", 1)}
    sent: list[dict[str, Any]] = []
    gone, asked = asyncio.Event(), [False]

    async def receive() -> dict[str, Any]:
        if not asked[0]:
            asked[0] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    gone.set()
    return sent


def _body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _statuses(sent: list[dict[str, Any]]) -> list[int]:
    return [m["status"] for m in sent if m["type"] == "http.response.start"]


def test_within_the_deadline_the_stream_passes_whole() -> None:
    sent = asyncio.run(_call("/v1/s"))
    assert _statuses(sent) == [200] and _body(sent) == b"data: first\n\ndata: second\n\n"
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_past_the_deadline_before_the_reply_is_a_408() -> None:
    sent = asyncio.run(_call("/v1/late"))
    assert _statuses(sent) == [408]
    assert json.loads(_body(sent))["error"]["code"] == "request_timeout"


def test_past_the_deadline_mid_stream_the_stream_is_cut() -> None:
    sent = asyncio.run(_call("/v1/s", b"stall=1"))
    assert _statuses(sent) == [200] and _body(sent) == b"data: first\n\n"
    assert sent[-1]["more_body"]  # no end: the stream is cut


async def _slow_body(request: Request) -> Response:
    await request.body()  # the client leaves first: Starlette raises ClientDisconnect
    return Response(b"never")


async def _read_then_late(request: Request) -> Response:
    await request.body()
    await asyncio.sleep(30)
    return Response(b"never")


def _left(path: str, caplog: Any) -> tuple[list[dict[str, Any]], float, list[int]]:
    """One request whose client leaves before its answer, through the telemetry and the guard
    in the ingress's order: what was sent, the cancelled count's rise, the logged status."""
    from router import metrics
    from router.telemetry import TelemetryMiddleware

    app = Starlette(routes=[Route("/v1/late", _read_then_late, methods=["POST"]),
                            Route("/v1/body", _slow_body, methods=["POST"])])
    app.add_middleware(ClientGuardMiddleware)
    app.add_middleware(TelemetryMiddleware)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [], "server": ("t", 80), "client": ("c", 1)}
    sent: list[dict[str, Any]] = []
    cancelled = metrics.KEY_REQUESTS.labels("unauthenticated", "", "cancelled")
    before = cancelled._value.get()  # noqa: SLF001 - prometheus_client's own reading

    async def run() -> None:
        calls = [0]

        async def receive() -> dict[str, Any]:
            calls[0] += 1
            if calls[0] == 1 and path == "/v1/late":  # its body, then the client leaves
                return {"type": "http.request", "body": b"{}", "more_body": False}
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)

    with caplog.at_level("INFO", logger="ray.serve.kvroute.access"):
        asyncio.run(run())
    logged = [json.loads(r.getMessage())["status"] for r in caplog.records
              if r.name == "ray.serve.kvroute.access"]
    return sent, cancelled._value.get() - before, logged  # noqa: SLF001


def test_a_client_that_leaves_before_the_answer_is_a_499_not_a_500(caplog: Any) -> None:
    sent, rise, logged = _left("/v1/late", caplog)
    assert _statuses(sent) == [] and rise == 1 and logged == [499]


def test_a_client_that_leaves_mid_body_is_a_499_with_no_traceback(caplog: Any) -> None:
    sent, rise, logged = _left("/v1/body", caplog)
    assert _statuses(sent) == [] and rise == 1 and logged == [499]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback logged
