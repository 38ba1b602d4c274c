"""The router's side of a loopback call (``workers.transport.loopback_call``): a request started on
a replica of this node over its loopback socket, without the Serve handle, with every
message back on that connection (``router.start_transport: loopback``).

``LoopbackCall`` iterates and cancels like Serve's ``DeploymentResponseGenerator``, so
``router.dispatch.generation`` streams, resumes and aborts it unchanged. As in
``router.dispatch.loopback_stream``, chunk frames that arrived together are merged into one
``Chunk``. An ``ERROR`` frame, or a socket that ends before the ``FINAL``, raises
``EngineError``: the dispatcher retries it before the first message, the generation
resumes it after. ``first()`` returns None for ``BUSY``: the replica is full or
stopping, and the request goes through Serve instead.
"""

from __future__ import annotations

from router.dispatch.loopback_stream import Frames, connect
from workers.protocol import (
    CHUNK,
    FRAME_HEADER,
    Chunk,
    EngineError,
    TokenLogprob,
    WorkerMessage,
    WorkRequest,
    parse_chunk,
)
from workers.transport.loopback_wire import (
    BUSY,
    CALL_KEY,
    ERROR,
    FINAL,
    KINDS,
    LOGPROBS,
    parse_final,
    parse_logprobs,
    parse_rejected,
    request_frame,
)


class CallRefused(EngineError):
    """The socket closed before any frame: a wrong token or replica id (the address now
    belongs to another replica, or to an older deployment). Nothing was started."""


class LoopbackCall:
    """One request on one replica (see the module docstring)."""

    def __init__(self, replica: str, frames: Frames) -> None:
        self._replica, self._frames = replica, frames
        self._done = False
        self._busy = False
        self._answered = False  # a frame came: the replica took the call

    @classmethod
    async def open(cls, replica: str, address: str, token: str,
                   work: WorkRequest) -> LoopbackCall:
        """Connect and send the request (``OSError``/``TimeoutError``: unreachable)."""
        frames = await connect(address)
        # the replica id too: a port a dead replica left may belong to another one now
        frames.write(f"{CALL_KEY} {replica} {token}\n".encode() + request_frame(work))
        return cls(replica, frames)

    async def first(self) -> WorkerMessage | None:
        """The first message; None if the replica is busy (nothing was started)."""
        while True:
            msg = self._take()
            if msg is not None or self._busy:
                return msg
            self._check_open()
            await self._frames.wait()

    def __aiter__(self) -> LoopbackCall:
        return self

    async def __anext__(self) -> WorkerMessage:
        while not self._done:
            msg = self._take()
            if msg is not None:
                return msg
            self._check_open()
            await self._frames.wait()
        raise StopAsyncIteration

    def cancel(self) -> None:
        """The client left (or the call ended): closing the connection cancels the
        generation on the replica, which aborts the engine request."""
        self._done = True
        if self._frames.transport is not None:
            self._frames.transport.close()

    def _check_open(self) -> None:
        if self._frames.closed:
            self.cancel()
            if not self._answered:
                raise CallRefused(f"loopback call to {self._replica} refused")
            raise EngineError(f"loopback call to {self._replica} ended without a final "
                              "message")

    def _take(self) -> WorkerMessage | None:
        """The next message: consecutive chunk frames merged; a ``FINAL`` ends the call.
        A frame that does not parse ends the call too, as the replica's failure."""
        try:
            return self._parse()
        except EngineError:
            raise
        except Exception as e:  # struct, UTF-8, JSON or field errors
            self.cancel()
            raise EngineError(f"loopback call to {self._replica}: bad frame: {e!r}") from None

    def _parse(self) -> WorkerMessage | None:
        buf, off, texts, ids = self._frames.buf, 0, [], []
        lps: list[TokenLogprob] = []
        prompt: tuple[TokenLogprob, ...] = ()  # the first chunk's
        view = memoryview(buf)
        out: WorkerMessage | None = None
        try:
            while len(buf) - off >= FRAME_HEADER.size:
                kind, length = FRAME_HEADER.unpack_from(buf, off)
                end = off + FRAME_HEADER.size + length
                if kind not in KINDS:
                    self.cancel()
                    raise EngineError(f"loopback call to {self._replica}: bad frame {kind}")
                self._answered = True
                if len(buf) < end:
                    self._frames.resume()  # a frame larger than the buffer's bound: read on
                    break
                if kind not in (CHUNK, LOGPROBS) and texts:
                    break  # a message after the chunks: the next call returns it
                with view[off + FRAME_HEADER.size:end] as payload:  # released: buf resizes
                    off = end
                    if kind == LOGPROBS:  # a chunk with its logprobs
                        body, more, first = parse_logprobs(payload)
                        lps.extend(more)
                        prompt = prompt or first
                        text, token_ids = parse_chunk(body)
                    elif kind != CHUNK:
                        out = self._message(kind, payload)
                        break
                    else:
                        text, token_ids = parse_chunk(payload)
                texts.append(text)
                ids.extend(token_ids)
        finally:
            view.release()
        self._frames.consumed(off)
        if not texts:
            return out
        return Chunk(self._replica, "".join(texts), tuple(ids), tuple(lps), prompt)

    def _message(self, kind: int, payload: memoryview) -> WorkerMessage | None:
        if kind == BUSY:
            self._busy = True
            self.cancel()
            return None
        if kind == ERROR:
            self.cancel()
            raise EngineError(f"replica {self._replica}: {bytes(payload).decode(errors='replace')}")
        self.cancel()  # FINAL or REJECTED: the call's last message
        return parse_final(payload) if kind == FINAL else parse_rejected(payload)
