"""``RequestIds`` (the direct listener's request-id layer) on its own, over a streamed reply:
the body passes byte for byte, the response carries the request's id (the client's if it
is a plain token, else a new one), and the app sees the same id in its request headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.app.listener import RequestIds

CHUNKS = [b"data: one\n\n", b"data: \xc3\xa9\n\n", b"data: [DONE]\n\n"]


async def _stream(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        for c in CHUNKS:
            yield c

    seen = request.headers.get("x-request-id", "")
    return StreamingResponse(body(), headers={"x-seen-id": seen})


async def _get(headers: dict[str, str]) -> httpx.Response:
    app = RequestIds(Starlette(routes=[Route("/s", _stream)]), "app")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        return await c.get("/s", headers=headers)


class HeldStreams:
    """An endpoint whose streams send one event, then wait for ``release``; ``all_open``
    is set once ``count`` of them have started."""

    def __init__(self, count: int) -> None:
        self.count, self.opened = count, 0
        self.release, self.all_open = asyncio.Event(), asyncio.Event()

    async def endpoint(self, request: Request) -> Response:
        self.opened += 1
        if self.opened == self.count:
            self.all_open.set()

        async def body() -> AsyncIterator[bytes]:
            yield b"data: one\n\n"
            await self.release.wait()
            yield b"data: [DONE]\n\n"
        return StreamingResponse(body())


def test_a_streamed_reply_passes_whole_with_the_clients_id() -> None:
    r = asyncio.run(_get({"x-request-id": "abc-123"}))
    assert r.content == b"".join(CHUNKS)
    assert r.headers.get_list("x-request-id") == ["abc-123"] == [r.headers["x-seen-id"]]


def test_an_id_that_is_not_a_plain_token_is_replaced() -> None:
    r = asyncio.run(_get({"x-request-id": "a b<script>"}))
    rid = r.headers["x-request-id"]
    assert rid != "a b<script>" and len(rid) == 32 and rid == r.headers["x-seen-id"]
    assert r.content == b"".join(CHUNKS)


def test_ongoing_counts_the_requests_open_now() -> None:
    """What the router replica reports to Serve's autoscaler under ``direct``: requests in
    flight, streams until their last byte, and none left after a failed one."""
    slow = HeldStreams(3)
    seen: list[int] = []

    async def fail(request: Request) -> Response:
        seen.append(ids.ongoing)
        raise RuntimeError("handler failed")

    ids = RequestIds(Starlette(routes=[Route("/slow", slow.endpoint), Route("/fail", fail)]), "app")

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ids),
                                     base_url="http://t") as c:
            streams = [asyncio.ensure_future(c.get("/slow")) for _ in range(3)]
            await slow.all_open.wait()
            assert ids.ongoing == 3
            try:
                await c.get("/fail")
            except RuntimeError:
                pass
            assert seen == [4] and ids.ongoing == 3
            slow.release.set()
            assert all(r.status_code == 200 for r in await asyncio.gather(*streams))
        assert ids.ongoing == 0

    asyncio.run(asyncio.wait_for(run(), 10))


def test_past_max_open_a_request_gets_a_fast_503_in_its_apis_shape() -> None:
    """With ``direct`` no Serve queue bounds a router replica's requests: the listener takes
    ``max_open`` at once and refuses the next at once, then takes requests again."""
    slow = HeldStreams(2)
    routes = [Route(path, slow.endpoint, methods=["POST"])
              for path in ("/v1/chat/completions", "/v1/messages")]
    ids = RequestIds(Starlette(routes=routes), "app", max_open=2)

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ids),
                                     base_url="http://t") as c:
            held = [asyncio.ensure_future(c.post("/v1/chat/completions")) for _ in range(2)]
            await slow.all_open.wait()
            openai, anthropic = await c.post("/v1/chat/completions"), await c.post("/v1/messages")
            assert openai.status_code == anthropic.status_code == 503
            assert openai.headers["retry-after"] == "1" and openai.headers["x-request-id"]
            assert openai.json()["error"]["code"] == "overloaded"
            assert anthropic.json()["error"]["type"] == "overloaded_error"
            assert ids.ongoing == 2 and slow.opened == 2  # the refused never reached it
            slow.release.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
            assert (await c.post("/v1/messages")).status_code == 200
        assert ids.ongoing == 0

    asyncio.run(asyncio.wait_for(run(), 10))
