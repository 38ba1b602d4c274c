"""The router-replica benchmark's parts (ops/bench/compare/scaling.py,
children/rr_front.py):
the round-robin front over real loopback servers, and the cached-ratio drop. The full
run (a redeploy per count) is a benchmark, not a test: `bench compare --router-replicas`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from ops.bench.compare.children.rr_front import make_app
from ops.bench.compare.scaling import drops
from ops.bench.harness.procs import free_port


def backend(name: str) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"x-backend": name})
        await out.prepare(request)
        body = await request.read()
        for piece in (b"data: ", name.encode(), b" ", body):  # streamed in pieces
            await out.write(piece)
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_front_takes_turns_and_streams_bodies_through() -> None:
    async with serving(backend("a")) as a, serving(backend("b")) as b, \
            serving(make_app([a, b])) as front, aiohttp.ClientSession() as s:
        seen = []
        for i in range(4):
            async with s.post(f"{front}/v1/chat/completions?x=1", data=f"q{i}") as r:
                seen.append((r.status, r.headers["x-backend"], await r.text()))
    assert seen == [(200, "a", "data: a q0"), (200, "b", "data: b q1"),
                    (200, "a", "data: a q2"), (200, "b", "data: b q3")]


def test_drop_is_smallest_count_minus_largest_in_points() -> None:
    by = {"4": {"k": {"cached_token_ratio": 0.80}, "s": {"cached_token_ratio": 0.5}},
          "1": {"k": {"cached_token_ratio": 0.81}, "s": {"cached_token_ratio": 0.7}},
          "2": {"k": {"cached_token_ratio": 0.0}}}
    got = drops(by)
    assert set(got) == {"k", "s"}
    assert abs(got["k"] - 1.0) < 1e-9 and abs(got["s"] - 20.0) < 1e-9
