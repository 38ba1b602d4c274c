"""A plain round-robin HTTP front over N router instances (router-replica benchmarks).

    python -m ops.bench.compare.children.rr_front PORT http://127.0.0.1:A http://127.0.0.1:B ...

Each request goes to the next instance in turn, body and response streamed through
unchanged (status, headers but hop-by-hop ones, chunks as they arrive). It stands for the
load balancer in front of a fleet of peer routers, each with its own state; it keeps no
state of its own. Binds 127.0.0.1 only. ``GET /v1/models`` answers from the first
instance (its readiness).
"""

from __future__ import annotations

import itertools
import sys

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
        "content-encoding"}


def make_app(backends: list[str]) -> web.Application:
    turn = itertools.cycle(backends)
    app = web.Application(client_max_size=1 << 30)

    async def start(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await app[SESSION].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        target = next(turn) + request.rel_url.path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        async with app[SESSION].request(request.method, target, data=body,
                                          headers=headers) as r:
            out = web.StreamResponse(status=r.status, headers={
                k: v for k, v in r.headers.items() if k.lower() not in _HOP})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main(argv: list[str]) -> None:
    port, backends = int(argv[0]), argv[1:]
    if not backends:
        raise SystemExit("usage: python -m ops.bench.compare.children.rr_front PORT URL [URL ...]")
    web.run_app(make_app(backends), host="127.0.0.1", port=port, print=None,
                access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
