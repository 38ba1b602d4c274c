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
