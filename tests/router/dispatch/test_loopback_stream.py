"""The loopback stream end to end in one process: ``workers.transport.loopback.LoopbackServer`` on a
real 127.0.0.1 socket, ``router.dispatch.loopback_stream.LoopbackStream`` reading it; the Serve
stream (Final / errors) is an async generator standing in for Serve's handle stream.
The same path on a real Serve stack: tests/e2e/test_loopback.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.dispatch.loopback_stream import LoopbackStream
from workers.protocol import (
    FRAME_HEADER,
    Chunk,
    EngineError,
    Final,
    Finished,
    Handoff,
    TokenChunk,
    Usage,
    chunk_frame,
    parse_chunk,
)
from workers.transport.loopback import LoopbackServer

TOKEN = "secret-token"
FINAL = Final("r1", Usage(3, 2, 0), "stop")


class FakeServe:
    """What the router holds of the Serve stream after the handoff: the Final (or an
    error) once the worker's pump is done; ``cancel`` recorded."""

    def __init__(self, done: asyncio.Event, error: Exception | None = None) -> None:
        self.done, self.error, self.cancelled = done, error, False

    def __aiter__(self) -> FakeServe:
        return self

    async def __anext__(self) -> Final:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return FINAL

    def cancel(self) -> None:
        self.cancelled = True


async def engine(chunks: list[str], gap_s: float = 0.0) -> AsyncGenerator[object, None]:
    for i, text in enumerate(chunks):
        yield TokenChunk(text, (i,))
        await asyncio.sleep(gap_s)
    yield Finished(Usage(3, len(chunks), 0), "stop")


async def start(server: LoopbackServer, items: AsyncIterator[object],
                serve: FakeServe) -> tuple[LoopbackStream, asyncio.Task[object]]:
    key = server.open()
    handoff = Handoff("r1", Chunk("r1", "", ()), server.address or "", key)

    async def worker() -> object:
        try:
            return await server.pump(await server.claim(key), items)
        finally:
            serve.done.set()

    task = asyncio.create_task(worker())
    return await LoopbackStream.open(handoff, serve, TOKEN), task


@given(st.text(max_size=20), st.lists(st.integers(0, 2**32 - 1), max_size=20))
@settings(max_examples=200)
def test_chunk_frame_round_trips(text: str, ids: list[int]) -> None:
    frame = chunk_frame(text, tuple(ids))
    kind, length = FRAME_HEADER.unpack_from(frame)
    assert length == len(frame) - FRAME_HEADER.size
    assert parse_chunk(memoryview(frame)[FRAME_HEADER.size:]) == (text, tuple(ids))


async def test_chunks_then_final_over_the_serve_stream() -> None:
    server = LoopbackServer(TOKEN)
    await server.start()
    try:
        stream, worker = await start(server, engine(["a", "é", "🙂", "d"], 0.01),
                                     FakeServe(asyncio.Event()))
        got = [m async for m in stream]
        assert isinstance(await worker, Finished)
        chunks = [m for m in got if isinstance(m, Chunk)]
        assert "".join(c.text for c in chunks) == "aé🙂d"
        assert [t for c in chunks for t in c.token_ids] == [0, 1, 2, 3]
        assert got[-1] == FINAL and all(c.replica == "r1" for c in chunks)
    finally:
        await server.stop()


async def test_frames_that_arrived_together_are_one_chunk() -> None:
    server = LoopbackServer(TOKEN)
    await server.start()
    try:
        stream, worker = await start(server, engine([str(i) for i in range(50)]),
                                     FakeServe(asyncio.Event()))
        await worker  # everything is in the socket before the router reads
        await asyncio.sleep(0.05)
        got = [m async for m in stream]
        assert len(got) == 2 and got[0].text == "".join(str(i) for i in range(50))
    finally:
        await server.stop()


async def test_a_wrong_token_is_refused_and_the_serve_error_ends_the_stream() -> None:
    server = LoopbackServer(TOKEN)
    await server.start()
    try:
        key = server.open()
        serve = FakeServe(asyncio.Event(), EngineError("no router claimed it"))
        handoff = Handoff("r1", Chunk("r1", "", ()), server.address or "", key)
        stream = await LoopbackStream.open(handoff, serve, "wrong")
        claim = asyncio.create_task(server.claim(key))
        await asyncio.sleep(0.2)
        assert not claim.done()  # the connection was refused, the slot still open
        serve.done.set()  # what the worker's generator raises once the claim times out
        with pytest.raises(EngineError):
            await asyncio.wait_for(anext(stream), 5)
        claim.cancel()
    finally:
        await server.stop()


async def test_a_replica_error_mid_stream_ends_the_wait() -> None:
    """The socket stays open but the Serve stream fails: no hang."""
    server = LoopbackServer(TOKEN)
    await server.start()
    try:
        serve = FakeServe(asyncio.Event(), RuntimeError("replica died"))
        stream, worker = await start(server, engine(["a"] * 1000, 10.0), serve)
        assert (await anext(stream)).text == "a"
        serve.done.set()
        with pytest.raises(RuntimeError, match="replica died"):
            await asyncio.wait_for(anext(stream), 5)
        worker.cancel()
    finally:
        await server.stop()


async def test_cancel_stops_the_workers_pump() -> None:
    server = LoopbackServer(TOKEN)
    await server.start()
    try:
        serve = FakeServe(asyncio.Event())
        stream, worker = await start(server, engine(["a"] * 10000, 0.005), serve)
        assert (await anext(stream)).text.startswith("a")
        stream.cancel()
        assert serve.cancelled
        with pytest.raises((ConnectionError, BrokenPipeError)):
            await asyncio.wait_for(worker, 5)  # the next write finds the socket gone
    finally:
        await server.stop()
