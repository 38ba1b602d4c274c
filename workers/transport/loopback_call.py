"""The worker's side of a loopback call: a request a router on this node starts over the
replica's loopback socket instead of the Serve handle (``router.start_transport:
loopback``), answered on the same connection (frames in ``workers.transport.loopback_wire``).

Why: starting a request through Serve's handle (its request router, a gRPC call, the
request pickled, a Serve stream for the first and last message) cost the router replica
~8 ms of Python per agent turn, ~2 ms with calls (docs/benchmarks.md, router overhead).

What Serve did for such a request is done here instead:
- the bound: a call is refused with ``BUSY`` when the replica already runs
  ``max_ongoing_requests`` (Serve's calls and loopback calls together) or is stopping;
  the router then sends it through Serve, whose queue and bound apply;
- cancel: the router closing the connection (the client left) cancels the generation,
  which aborts the engine request, even during a long prefill with nothing to write;
- errors: a failing engine sends ``ERROR``; a replica that dies closes the socket. Either
  way the router retries (before the first chunk) or resumes the stream (after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from workers.protocol import FRAME_HEADER, Chunk, Final, WorkerMessage, WorkRequest
from workers.transport.loopback_wire import (
    BUSY_FRAME,
    MAX_REQUEST_BYTES,
    REQUEST,
    chunk_frames,
    error_frame,
    final_frame,
    ids_in_steps,
    ids_part,
    parse_request,
    rejected_frame,
    send,
)

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0  # the request frame follows the handshake line at once


class CallTarget(Protocol):
    """The replica, as a loopback call needs it (``workers.deployment.LoopbackCalls``)."""

    replica: str  # its Serve replica id: a call names the replica it is for

    def admit(self) -> bool:
        """Take a slot for one call (False: full or stopping)."""
        ...

    def release(self) -> None: ...

    def run(self, work: WorkRequest) -> AsyncIterator[WorkerMessage]: ...


async def serve_call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     target: CallTarget) -> None:
    """Read one request from an authenticated connection and answer it there."""
    try:
        work = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT_S)
    except (Exception, asyncio.CancelledError) as e:
        log.warning("loopback call refused: %r", e)
        writer.close()
        return
    if not target.admit():
        if not writer.is_closing():  # the router may have left (uvloop raises then)
            writer.write(BUSY_FRAME)
        writer.close()
        return
    try:
        pump = asyncio.ensure_future(_pump(writer, target.run(work)))
        gone = asyncio.ensure_future(reader.read(1))  # EOF: the router (the client) left
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (gone, pump):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
    finally:
        target.release()
        writer.close()


async def _read_request(reader: asyncio.StreamReader) -> WorkRequest:
    kind, length = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    if kind != REQUEST or length > MAX_REQUEST_BYTES:
        raise ValueError(f"loopback call: frame {kind} of {length} bytes is no request")
    payload = await reader.readexactly(length)
    return parse_request(payload, await ids_in_steps(ids_part(payload)))


async def _pump(writer: asyncio.StreamWriter, messages: AsyncIterator[WorkerMessage]) -> None:
    """Every message as its frame, flow-controlled by the socket; an engine failure as
    ``ERROR``. The messages' generator is closed here, so a cancel aborts the engine."""
    try:
        async for msg in messages:
            if isinstance(msg, Chunk):
                await send(writer, chunk_frames(msg.text, msg.token_ids, msg.logprobs,
                                                 msg.prompt_logprobs))
            elif isinstance(msg, Final):
                await send(writer, final_frame(msg))
            else:
                await send(writer, rejected_frame(msg))
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception as e:  # the engine failed the request
        log.warning("loopback call failed: %r", e)
        with contextlib.suppress(ConnectionError):
            await send(writer, error_frame(repr(e)))
    finally:
        with contextlib.suppress(Exception):
            await messages.aclose()  # type: ignore[attr-defined]
