"""A loopback call end to end in one process: ``workers.transport.loopback.LoopbackServer`` on a
real 127.0.0.1 socket taking the call for a fake replica (``CallTarget``), and
``router.dispatch.loopback_call.LoopbackCall`` starting it. The same path on real Serve:
tests/e2e/test_loopback.py (and every e2e test, on the default transports)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
import uvloop

from cache_service.events import BlockStored, CacheEvent
from router.dispatch.loopback_call import CallRefused, LoopbackCall
from router.dispatch.loopback_stream import Frames, connect
from workers.protocol import (
    FRAME_HEADER,
    Chunk,
    EngineError,
    Final,
    Rejected,
    SamplingParams,
    Usage,
    WorkerMessage,
    WorkRequest,
    chunk_frame,
)
from workers.transport.loopback import LoopbackServer
from workers.transport.loopback_wire import FINAL, frame

TOKEN = "secret-token"
WORK = WorkRequest("req-1", [1, 2, 3], SamplingParams(max_tokens=4))


class Replica:
    """A fake replica: ``slots`` calls at once; each call streams ``chunks``."""

    def __init__(self, chunks: list[str], slots: int = 1, gap_s: float = 0.0,
                 fail_after: int | None = None, reject: bool = False,
                 prefill_s: float = 0.0, replica: str = "r1",
                 events: tuple[CacheEvent, ...] = ()) -> None:
        self.chunks, self.slots, self.gap_s, self.prefill_s = chunks, slots, gap_s, prefill_s
        self.fail_after, self.reject, self.replica, self.events = (fail_after, reject,
                                                                   replica, events)
        self.open = 0
        self.seen: list[WorkRequest] = []
        self.closed: list[str] = []  # how each run ended: "done" or "cancelled"

    def admit(self) -> bool:
        if self.open >= self.slots:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def run(self, work: WorkRequest) -> AsyncIterator[WorkerMessage]:
        self.seen.append(work)
        return self._run()

    async def _run(self) -> AsyncGenerator[WorkerMessage, None]:
        try:
            if self.reject:
                yield Rejected("r1", "prompt too long", 400)
                return
            await asyncio.sleep(self.prefill_s)
            for i, text in enumerate(self.chunks):
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineError("engine died")
                yield Chunk("r1", text, (i,))
                await asyncio.sleep(self.gap_s)
            yield Final("r1", Usage(3, len(self.chunks), 2), "stop", events=self.events)
            self.closed.append("done")
        except (GeneratorExit, asyncio.CancelledError):  # aclose, or the pump's cancel
            self.closed.append("cancelled")
            raise


async def serving(replica: Replica) -> LoopbackServer:
    server = LoopbackServer(TOKEN, calls=replica)
    await server.start()
    return server


async def ended(replica: Replica) -> None:
    """Until the replica's run has ended (at most 5 s)."""
    for _ in range(100):
        if replica.closed:
            return
        await asyncio.sleep(0.05)


async def call(server: LoopbackServer, token: str = TOKEN) -> LoopbackCall:
    return await LoopbackCall.open("r1", server.address or "", token, WORK)


async def test_a_call_streams_its_chunks_then_the_final() -> None:
    replica = Replica(["a", "b", "c"], gap_s=0.01)
    server = await serving(replica)
    try:
        c = await call(server)
        first = await c.first()
        got = [first] + [m async for m in c]
        assert "".join(m.text for m in got if isinstance(m, Chunk)) == "abc"
        assert got[-1] == Final("r1", Usage(3, 3, 2), "stop")
        assert [m.token_ids for m in got if isinstance(m, Chunk)] == [(0,), (1,), (2,)]
        assert replica.seen == [WORK] and replica.closed == ["done"]
        await asyncio.sleep(0.05)
        assert replica.open == 0
    finally:
        await server.stop()


async def test_chunks_that_arrived_together_are_one_message() -> None:
    replica = Replica(list("abcdef"))
    server = await serving(replica)
    try:
        c = await call(server)
        await asyncio.sleep(0.2)  # everything has arrived
        first = await c.first()
        assert isinstance(first, Chunk) and first.text == "abcdef"
        assert first.token_ids == tuple(range(6))
        assert isinstance(await anext(c), Final)
        with pytest.raises(StopAsyncIteration):
            await anext(c)
    finally:
        await server.stop()


async def test_a_full_replica_answers_busy_and_runs_nothing() -> None:
    replica = Replica(["x"] * 100, gap_s=0.01)
    server = await serving(replica)
    try:
        running = await call(server)
        assert isinstance(await running.first(), Chunk)
        busy = await call(server)
        assert await busy.first() is None
        assert len(replica.seen) == 1
        running.cancel()
    finally:
        await server.stop()


async def test_a_rejection_and_an_engine_error() -> None:
    server = await serving(Replica([], reject=True))
    try:
        assert await (await call(server)).first() == Rejected("r1", "prompt too long", 400)
    finally:
        await server.stop()
    server = await serving(Replica(["a", "b", "c"], gap_s=0.01, fail_after=2))
    try:
        c = await call(server)
        assert isinstance(await c.first(), Chunk)
        with pytest.raises(EngineError, match="engine died"):
            async for _ in c:
                pass
    finally:
        await server.stop()


async def test_a_wrong_token_or_replica_is_refused_and_runs_nothing() -> None:
    replica = Replica(["a"], replica="r2")  # the port now belongs to another replica
    server = await serving(replica)
    try:
        for token in ("wrong", TOKEN):
            c = await call(server, token=token)
            with pytest.raises(CallRefused):
                await asyncio.wait_for(c.first(), 5)
        assert replica.seen == []
    finally:
        await server.stop()


async def raw_replica(frames: bytes) -> tuple[asyncio.Server, str]:
    """A socket that answers any call with ``frames`` and keeps the connection open."""
    closed = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frames)
        await reader.read()  # until the router closes
        closed.set()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    server.closed_by_router = closed  # type: ignore[attr-defined]
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("frames", [
    FRAME_HEADER.pack(99, 0),  # an unknown kind
    frame(FINAL, b"{not json"),
    chunk_frame("a", (1,))[:-1] + b"\xff",  # text that is not UTF-8
])
async def test_a_bad_frame_is_the_replicas_failure_and_ends_the_call(frames: bytes) -> None:
    server, address = await raw_replica(chunk_frame("ok", (0,)) + frames)
    try:
        c = await LoopbackCall.open("r1", address, TOKEN, WORK)
        with pytest.raises(EngineError) as err:
            async for _ in c:
                pass
        assert not isinstance(err.value, CallRefused)
        await asyncio.wait_for(server.closed_by_router.wait(), 5)  # type: ignore[attr-defined]
    finally:
        server.close()


async def test_a_final_larger_than_the_read_buffer_arrives() -> None:
    """The reader pauses past 1 MiB; a frame larger than that must still complete."""
    events = (BlockStored("m", "r1", tuple(range(10**12, 10**12 + 200_000))),)  # ~2.8 MB
    server = await serving(Replica(["a"], events=events))
    try:
        c = await call(server)
        assert isinstance(await c.first(), Chunk)
        final = await asyncio.wait_for(anext(c), 10)
        assert isinstance(final, Final) and final.events == events
    finally:
        await server.stop()


async def test_cancel_ends_the_replicas_generation() -> None:
    replica = Replica(["a"] * 10000, gap_s=0.005)
    server = await serving(replica)
    try:
        c = await call(server)
        assert isinstance(await c.first(), Chunk)
        c.cancel()
        await ended(replica)
        assert replica.closed == ["cancelled"] and replica.open == 0
    finally:
        await server.stop()


async def test_a_client_leaving_during_prefill_ends_it_there() -> None:
    """Nothing is written during a long prefill, so only the watch on the socket's end
    can stop it (a write would find the socket gone only after the prefill)."""
    replica = Replica(["a"], prefill_s=60)
    server = await serving(replica)
    try:
        c = await call(server)
        first = asyncio.ensure_future(c.first())
        await asyncio.sleep(0.2)
        first.cancel()  # the client left while waiting for the first token
        c.cancel()
        await ended(replica)
        assert replica.closed == ["cancelled"] and replica.open == 0
    finally:
        await server.stop()


async def test_a_replica_that_stops_mid_call_raises() -> None:
    replica = Replica(["a"] * 10000, gap_s=0.005)
    server = await serving(replica)
    c = await call(server)
    assert isinstance(await c.first(), Chunk)
    await server.stop()  # cancels the call: the socket closes without a final
    with pytest.raises(EngineError, match="without a final"):
        async for _ in c:
            pass


def test_a_replica_that_resets_before_the_request_is_written_refuses_the_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica dies between the router's connect and its first write (CI saw it in
    the chaos test): under uvloop, Serve's loop, a write to the reset handle raised
    RuntimeError, a 500. Now the call is refused, and the dispatcher sends the request
    through Serve."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # an RST, as from a killed process

    async def connect_then_reset(address: str) -> Frames:
        frames = await connect(address)
        for _ in range(200):  # the reset is processed before open() writes
            if frames.closed:
                break
            await asyncio.sleep(0.01)
        assert frames.closed
        return frames

    async def scenario() -> None:
        server = await asyncio.start_server(reset, "127.0.0.1", 0)
        try:
            address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            c = await LoopbackCall.open("r1", address, TOKEN, WORK)
            with pytest.raises(CallRefused):
                await asyncio.wait_for(c.first(), 5)
        finally:
            server.close()

    monkeypatch.setattr("router.dispatch.loopback_call.connect", connect_then_reset)
    uvloop.run(scenario())
