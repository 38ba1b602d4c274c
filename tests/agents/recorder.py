"""A recording reverse proxy on loopback, between a real agent CLI and a kvroute stack.

Every exchange (method, path, request headers and body, response status and
kvroute's routing headers) is kept, and responses stream through unchanged (SSE
included), so a test can assert what the CLI sent (its identity headers, its
request shape) and that it never needed a retry (no 4xx/5xx on the way).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_TAIL = 1 << 16
_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding",
                  "accept-encoding"})


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    ttfb_s: float = 0.0  # request sent to kvroute → its response headers (first token)
    tail: bytes = b""  # the response body's last bytes (its closing SSE events)

    def last_event(self, kind: str) -> dict[str, Any]:
        """The last SSE event ``kind`` in the response's tail (its ``data`` as JSON)."""
        frames = [f for f in self.tail.decode(errors="replace").split("\n\n")
                  if f"event: {kind}" in f]
        assert frames, f"no {kind} event in {self.path}'s response"
        data = frames[-1].split("data: ", 1)[1]
        return json.loads(data)

    def usage(self) -> dict[str, Any]:
        """The response's last ``usage`` object (a whole body's, or the last SSE chunk's)."""
        text = self.tail.decode(errors="replace")
        datas = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
        for data in reversed(datas or [text]):
            try:
                found = json.loads(data)
            except ValueError:
                continue
            use = found.get("usage") or found.get("response", {}).get("usage")
            if use:
                return use
        raise AssertionError(f"no usage in {self.path}'s response")

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def replica(self) -> str | None:
        return self.response_headers.get("x-kvroute-replica")


class Recorder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.blocked: list[str] = []  # hosts a CLI tried to reach past loopback (refused)
        self.url = ""

    def calls(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == path]

    def failures(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.status >= 400]

    def report(self, client: str) -> None:
        """One line per routed request (``pytest -s``): replica and time to first byte."""
        for i, e in enumerate(x for x in self.exchanges if x.replica):
            print(f"{client} request {i + 1}: {e.path} replica {e.replica}, predicted cached "
                  f"{e.response_headers.get('x-kvroute-predicted-cached-tokens')}, first byte "
                  f"after {e.ttfb_s * 1000:.0f} ms")

    async def _forward(self, request: Request) -> Response:
        host = request.headers.get("host", "").rsplit(":", 1)[0]
        if request.method == "CONNECT" or host not in ("127.0.0.1", "localhost"):
            # the CLI used us as its proxy for another host: it stays on loopback
            self.blocked.append(host or request.url.path)
            return Response(status_code=403)
        body = await request.body()
        ex = Exchange(request.method, request.url.path, dict(request.headers), body)
        self.exchanges.append(ex)
        client = httpx.AsyncClient(timeout=httpx.Timeout(600.0))
        headers = {k: v for k, v in request.headers.items() if k not in _HOP}
        url = f"{self.upstream}{request.url.path}"
        if request.url.query:
            url += f"?{request.url.query}"
        started = time.perf_counter()
        upstream = await client.send(client.build_request(request.method, url, headers=headers,
                                                          content=body), stream=True)
        ex.ttfb_s = time.perf_counter() - started
        ex.status, ex.response_headers = upstream.status_code, dict(upstream.headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    ex.tail = (ex.tail + chunk)[-_TAIL:]
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        out = {k: v for k, v in upstream.headers.items() if k not in _HOP
               and k != "content-encoding"}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=out)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._forward,
                                       methods=["GET", "POST", "HEAD", "DELETE", "PUT",
                                                "CONNECT", "PATCH", "OPTIONS"])])


@contextmanager
def recording(upstream: str, port: int) -> Iterator[Recorder]:
    """A ``Recorder`` served on 127.0.0.1:``port`` in a thread, stopped on exit."""
    rec = Recorder(upstream)
    server = uvicorn.Server(uvicorn.Config(rec.app(), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="recorder", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the recording proxy did not start")
        time.sleep(0.05)
    rec.url = f"http://127.0.0.1:{port}"
    try:
        yield rec
    finally:
        server.should_exit = True
        thread.join(timeout=10)
