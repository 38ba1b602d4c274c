"""Router CPU per streamed token, in process: the OpenAI chat stream of one generation
through the router's own ASGI stack (``RequestIds``, telemetry, client guard, FastAPI,
``GenerationStream`` over ``openai_routes.ChatReply.stream``), with a fake replica stream that never
waits, and no socket (what a real stream adds per token on top: the write syscall and the
loopback stream's wake-up). Also the tool-call parser and the chunk encoder on their own.

``kvroute bench micro stream-cost [N]``: CPU µs (process time) per token, from the medians of
N requests of 140 and of 1 one-word chunks (the sim engine's ``" w123"``), alternated, with
tools declared (hermes parser).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ops.bench.harness.micro import cpu_s, median_cpu_s
from router import telemetry
from router.api.common import request as hu
from router.api.openai import encode as oa
from router.api.openai import routes as openai_routes
from router.app.client_guard import ClientGuardMiddleware
from router.app.listener import RequestIds
from router.dispatch.dispatch import Started
from router.dispatch.generation import Generation
from router.output import tool_calls as tc
from router.output.tool_parsers import hermes
from router.routing.context import Candidate
from router.routing.load import LoadTracker
from router.telemetry import TelemetryMiddleware
from workers.protocol import Chunk, Final, Usage, WorkerMessage

TOKENS = 140
TEXTS = [f" w{1000 + 37 * i}" for i in range(TOKENS)]


class _Stream:
    def __init__(self, msgs: list[WorkerMessage]) -> None:
        self._it = iter(msgs)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> WorkerMessage:
        for msg in self._it:
            return msg
        raise StopAsyncIteration

    def cancel(self) -> None: ...


class _Owner:
    max_resumes = 0

    def __init__(self) -> None:
        self.loads = LoadTracker()

    def on_first_token(self) -> None: ...

    def on_final(self, model: str, final: Final) -> None: ...

    def refund(self, key: Any, tokens: int) -> None: ...

    async def resume(self, gen: Generation, err: Exception) -> WorkerMessage:
        raise err


def _generation(owner: _Owner, tokens: int) -> Generation:
    msgs: list[WorkerMessage] = [Chunk("r", t, (i,)) for i, t in enumerate(TEXTS[:tokens])]
    msgs.append(Final("r", Usage(14000, tokens, 13000), "stop"))
    ticket = owner.loads.begin("m", "r", 14000)
    run = Started("m", Candidate("m", "r"), msgs[0], _Stream(msgs[1:]), ticket)
    return Generation("m", "r", "router", 0, 14000, run.first, run, owner,  # type: ignore[arg-type]
                      telemetry.current())


def _app() -> Any:
    app = FastAPI()
    app.add_middleware(ClientGuardMiddleware)
    app.add_middleware(TelemetryMiddleware)
    app.state.request_timeout_s = 3600.0
    owner = _Owner()
    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        gen = _generation(owner, int(await request.body()))
        body = openai_routes.ChatReply(gen, oa.ChatOutput(oa.ChunkEncoder("chatcmpl-1", "m", True)),
                                       hermes.FAMILY.parser(tc.schemas(tools)), None, "chatcmpl-1",
                                       "m", True, True).stream()
        return hu.GenerationStream(body, gen, {"x-kvroute-replica": "r"})

    return RequestIds(app, "bench")


async def _request(app: Any, tokens: int) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 5000),
             "headers": [(b"content-type", b"application/json"), (b"host", b"bench")]}
    sent = [False]
    gone = asyncio.Event()
    size = 0

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": b"%d" % tokens, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal size
        size += len(message.get("body", b""))

    await app(scope, receive, send)
    gone.set()
    return size


def _per_token(n: int, once: Any) -> float:
    return median_cpu_s(once, n) / TOKENS * 1e6


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("n", type=int, nargs="?", default=400, help="requests of each length")


def run(args: argparse.Namespace) -> int:
    n = args.n
    telemetry.ACCESS.setLevel(logging.WARNING)  # one access line per request: not ours
    app = _app()
    loop = asyncio.new_event_loop()
    long, short = [], []  # alternated: the difference is the per-token part
    for i in range(n + 50):
        for tokens, times in ((TOKENS, long), (1, short)):
            t = cpu_s(lambda: loop.run_until_complete(_request(app, tokens)))  # noqa: B023
            if i >= 50:
                times.append(t)
    request = statistics.median(short) * 1e6
    whole = (statistics.median(long) - statistics.median(short)) / (TOKENS - 1) * 1e6

    def parse() -> None:
        p = hermes.FAMILY.parser()
        for t in TEXTS:
            p.feed(t)
        p.flush()

    enc = oa.ChunkEncoder("chatcmpl-1", "m", chat=True)
    parser = _per_token(n * 10, parse)
    encode = _per_token(n * 10, lambda: [enc.text(t) for t in TEXTS])
    print(f"stream {whole:.2f} us/token over a 1-token request's {request:.0f} us; parser "
          f"{parser:.2f} us/token, encoder {encode:.2f} (CPU, medians of {n} requests)")
    return 0
