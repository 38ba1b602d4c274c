"""The router's side of a loopback stream (``workers.transport.loopback``;
``router.stream_transport:
loopback``): after a replica's ``Handoff`` the chunks come over a TCP connection to it on
127.0.0.1, the ``Final`` (or the replica's error) over the Serve stream.

``LoopbackStream`` iterates and cancels like Serve's ``DeploymentResponseGenerator``, so
``router.dispatch.generation`` streams, resumes and aborts it unchanged. Chunk frames that arrived
together are merged into one ``Chunk`` (text and token ids concatenated, as the engines'
``take_ready`` does): one SSE write per read, never waiting for more. Reading pauses while
more than ``BUFFER_LIMIT`` bytes wait (the worker's drain then holds the engine's queue).
A socket that ends without the end frame (the replica died, or failed) is reported by the
Serve stream, which raises the replica's error rather than hanging.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from workers.protocol import (
    CHUNK,
    END,
    FRAME_HEADER,
    Chunk,
    EngineError,
    Handoff,
    TokenLogprob,
    WorkerMessage,
    parse_chunk,
)
from workers.transport.loopback_wire import LOGPROBS, parse_logprobs

BUFFER_LIMIT = 1 << 20
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Loopback:
    """What a router needs to take loopback streams: its Ray node (replicas elsewhere keep
    the Serve stream) and the app's stream token."""

    node: str
    token: str


class Frames(asyncio.Protocol):
    """Bytes from the worker, kept until the stream takes them; reading paused when full."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > BUFFER_LIMIT and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self.wake()

    def eof_received(self) -> bool:
        self.closed = True
        self.wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.wake()

    def consumed(self, n: int) -> None:
        del self.buf[:n]
        if len(self.buf) <= BUFFER_LIMIT // 2:
            self.resume()

    def write(self, data: bytes) -> None:
        """Send ``data``; on a connection the peer already reset, nothing: the reader
        then sees ``closed``. (uvloop raises on a write to a closed handle, and the
        replica may die between the connect and the first write.)"""
        assert self.transport is not None  # connected: create_connection made it
        if self.closed or self.transport.is_closing():
            self.closed = True
            return
        self.transport.write(data)

    def resume(self) -> None:
        """Read on although the buffer is past its bound: the frame at its head is not
        whole yet (a large one), and nothing else can be taken before it."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def wake(self, _: object = None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


async def connect(address: str) -> Frames:
    """A connection to a replica's loopback socket (``OSError``, ``ValueError`` or
    ``TimeoutError`` if it cannot be reached)."""
    host, _, port = address.rpartition(":")
    _, frames = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
        Frames, host, int(port)), CONNECT_TIMEOUT_S)
    return frames


class LoopbackStream:
    """The rest of a handed-off stream (see the module docstring)."""

    def __init__(self, handoff: Handoff, serve_stream: Any, frames: Frames) -> None:
        self._replica, self._serve, self._frames = handoff.replica, serve_stream, frames
        self._ended = False  # the end frame came: the Final is next, on the Serve stream
        self._done = False
        # The Serve stream's next item, awaited alongside the socket: the replica's error
        # (or death) ends the wait even if the socket stays open.
        self._tail: asyncio.Future[Any] = asyncio.ensure_future(anext(serve_stream, None))
        self._tail.add_done_callback(frames.wake)

    @classmethod
    async def open(cls, handoff: Handoff, serve_stream: Any, token: str) -> LoopbackStream:
        """Connect to the replica and claim the handed-off stream (``OSError`` or
        ``TimeoutError`` if it cannot be reached)."""
        frames = await connect(handoff.address)
        frames.write(f"{handoff.key} {token}\n".encode())
        return cls(handoff, serve_stream, frames)

    def __aiter__(self) -> LoopbackStream:
        return self

    async def __anext__(self) -> WorkerMessage:
        while not self._ended:
            msg = self._take()
            if msg is not None:
                return msg
            tail = self._tail
            if self._frames.closed or (tail.done() and (tail.cancelled() or tail.exception())):
                break  # no end frame: the Serve stream says what happened
            await self._frames.wait()
        return await self._final()

    def cancel(self) -> None:
        """The client left: cancel the Serve call (the worker stops and aborts the engine
        request) and drop the connection."""
        self._done = True
        self._tail.cancel()
        self._serve.cancel()
        self._close()

    def _take(self) -> Chunk | None:
        """Every complete frame in the buffer, chunks merged; sets ``_ended`` at END."""
        buf, off, texts, ids = self._frames.buf, 0, [], []
        lps: list[TokenLogprob] = []
        prompt: tuple[TokenLogprob, ...] = ()
        view = memoryview(buf)
        try:
            while len(buf) - off >= FRAME_HEADER.size:
                kind, length = FRAME_HEADER.unpack_from(buf, off)
                end = off + FRAME_HEADER.size + length
                if len(buf) < end:
                    break
                if kind == CHUNK:
                    text, token_ids = parse_chunk(view[off + FRAME_HEADER.size:end])
                    texts.append(text)
                    ids.extend(token_ids)
                elif kind == LOGPROBS:  # a chunk with its logprobs
                    body, more, first = parse_logprobs(view[off + FRAME_HEADER.size:end])
                    text, token_ids = parse_chunk(body)
                    texts.append(text)
                    ids.extend(token_ids)
                    lps.extend(more)
                    prompt = prompt or first
                off = end
                if kind == END:
                    self._ended = True
                    break
        finally:
            view.release()
        self._frames.consumed(off)
        if not texts:
            return None
        return Chunk(self._replica, "".join(texts), tuple(ids), tuple(lps), prompt)

    async def _final(self) -> WorkerMessage:
        if self._done:
            raise StopAsyncIteration
        self._done = True
        self._close()
        msg = await self._tail  # the Final, or the replica's error
        if msg is None:
            raise EngineError(f"stream of {self._replica} ended without a final message")
        return msg  # type: ignore[no-any-return]

    def _close(self) -> None:
        if self._frames.transport is not None:
            self._frames.transport.close()
