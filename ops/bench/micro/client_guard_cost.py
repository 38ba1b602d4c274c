"""Per-request cost of ``router.app.client_guard.ClientGuardMiddleware`` in process (ASGI over
httpx's ASGITransport, no network): a trivial unstreamed route and a 20-chunk stream, with
and without the middleware, alternated. ``kvroute bench micro client-guard-cost [N]``."""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ops.bench.harness.micro import timing
from router.app.client_guard import ClientGuardMiddleware

WARMUP = 200


async def _unstreamed(request: Request) -> Response:
    await request.body()
    return JSONResponse({"ok": True})


async def _streamed(request: Request) -> Response:
    await request.body()

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"data: x\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


def _app(guarded: bool) -> Starlette | ClientGuardMiddleware:
    app = Starlette(routes=[Route("/u", _unstreamed, methods=["POST"]),
                            Route("/s", _streamed, methods=["POST"])])
    app.state.request_timeout_s = 3600.0
    return ClientGuardMiddleware(app) if guarded else app


async def medians(path: str, n: int) -> dict[bool, float]:
    """Median seconds per request, without (False) and with (True) the middleware."""
    clients = {g: httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(g)),
                                    base_url="http://bench") for g in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n + WARMUP):
        for g in ((False, True) if i % 2 else (True, False)):
            with timing() as t:
                await clients[g].post(path, json={"x": 1})
            if i >= WARMUP:
                times[g].append(t.wall_s)
    for c in clients.values():
        await c.aclose()
    return {g: statistics.median(t) for g, t in times.items()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("n", type=int, nargs="?", default=3000, help="requests per variant")


def run(args: argparse.Namespace) -> int:
    n = args.n
    for path, name in (("/u", "unstreamed"), ("/s", "20-chunk stream")):
        m = asyncio.run(medians(path, n))
        print(f"{name}: without {m[False] * 1e6:.0f} us, with {m[True] * 1e6:.0f} us, "
              f"added {(m[True] - m[False]) * 1e6:.0f} us (median of {n})")
    return 0
