"""A replica's loopback stream socket: token chunks to a router on the same node without a
Serve message per chunk (``router.stream_transport: loopback``).

Why: on the agent workload each streamed token crossed Ray Serve as its own actor-stream
message (pickled, gRPC, an object ref per item), which cost the router replica more CPU
than all its own work per request (docs/benchmarks.md, router overhead). Here a request still
starts over the Serve handle, so Serve's request router, queue bound, retries before the
first message, ``Rejected`` and cancellation all stay as they are; only the chunks after
the first go over a plain TCP connection on 127.0.0.1:

1. the worker takes the first chunk, opens a slot under a random key and yields
   ``Handoff(first, address, key)`` on the Serve stream;
2. the router connects and sends ``<key> <token>\\n`` (the per-app random token the
   builder gives router and workers; compared in constant time);
3. the worker writes each chunk as a frame (below) as the engine releases it, waiting on
   the socket's drain (so a slow router holds the engine's queue, not a second buffer),
   then an end frame; the ``Final`` goes over the Serve stream.

The Serve stream stays open all along: Serve's cancel (the client left) stops the worker's
generator (which closes the socket and aborts the engine request), and a replica that
dies ends both the socket and the Serve stream with an error. A slot nobody claims within
``CLAIM_TIMEOUT_S`` fails the request.

The frames are ``workers.protocol``'s (``chunk_frame``, ``END_FRAME``).

The same socket takes loopback calls (``call <replica> <token>\n``,
``workers.transport.loopback_call``): a
router that learned this address from a ``Handoff`` starts later requests here, skipping
the Serve handle, and gets every message on that connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import AsyncIterator

from workers.protocol import END_FRAME, EngineError, TokenChunk
from workers.transport.loopback_call import CallTarget, serve_call
from workers.transport.loopback_wire import CALL_KEY, chunk_frames, send

log = logging.getLogger(__name__)

CLAIM_TIMEOUT_S = 10.0
CALL = CALL_KEY.encode()
_HANDSHAKE_TIMEOUT_S = 5.0
_HANDSHAKE_LIMIT = 512


class LoopbackServer:
    """The worker side: one listening socket per replica on 127.0.0.1 and the open slots."""

    def __init__(self, token: str, host: str = "127.0.0.1",
                 calls: CallTarget | None = None) -> None:
        self._token, self._host = token.encode(), host
        self._calls = calls  # takes loopback calls (workers.transport.loopback_call) when set
        self._slots: dict[str, asyncio.Future[asyncio.StreamWriter]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.address: str | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, 0,
                                                  limit=_HANDSHAKE_LIMIT)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{self._host}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for slot in self._slots.values():
                slot.cancel()
            self._slots.clear()
            running = list(self._running)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)  # engine aborts done
            await self._server.wait_closed()
            self._server = None

    def open(self) -> str:
        """A new slot's key (unguessable: the key alone claims nothing without the token)."""
        key = secrets.token_hex(16)
        self._slots[key] = asyncio.get_running_loop().create_future()
        return key

    async def claim(self, key: str) -> asyncio.StreamWriter:
        """The router's connection for slot ``key``; ``EngineError`` if none comes in time."""
        slot = self._slots[key]
        try:
            return await asyncio.wait_for(slot, CLAIM_TIMEOUT_S)
        except TimeoutError:
            raise EngineError(f"no router claimed loopback stream {key}") from None
        finally:
            self._slots.pop(key, None)

    def drop(self, key: str) -> None:
        """Forget an unclaimed slot (its request ended before the router connected)."""
        slot = self._slots.pop(key, None)
        if slot is not None:
            slot.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``<key> <token>`` claims a slot; ``call <replica> <token>`` starts a loopback
        call on this replica (another replica id: its port was reused, refused)."""
        try:
            line = await asyncio.wait_for(reader.readline(), _HANDSHAKE_TIMEOUT_S)
            key, _, token = line.strip().partition(b" ")
            replica = b""
            if key == CALL:
                replica, _, token = token.partition(b" ")
            if not hmac.compare_digest(token, self._token):
                raise PermissionError("bad loopback handshake")
            calls = self._calls if key == CALL else None
            if calls is not None and replica.decode("ascii", "replace") != calls.replica:
                raise PermissionError(f"loopback call for replica {replica!r}")
            slot = None if calls else self._slots.get(key.decode("ascii", "replace"))
            if calls is None and (slot is None or slot.done()):
                raise PermissionError("bad loopback handshake")
        except (Exception, asyncio.CancelledError) as e:
            log.warning("loopback stream connection refused: %r", e)
            writer.close()
            return
        if calls is not None:
            await self._call(reader, writer, calls)
        elif slot is not None:
            slot.set_result(writer)

    async def _call(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    calls: CallTarget) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)  # stop() cancels it (the replica is going)
        try:
            await serve_call(reader, writer, calls)
        finally:
            self._running.discard(task)

    @staticmethod
    async def pump(writer: asyncio.StreamWriter,
                   items: AsyncIterator[object]) -> object | None:
        """Write ``items``' chunks to ``writer`` until the first item that is not a chunk,
        which is returned after the end frame (None: the items ended)."""
        try:
            async for item in items:
                if not isinstance(item, TokenChunk):
                    await send(writer, END_FRAME)
                    return item
                await send(writer, chunk_frames(item.text, item.token_ids, item.logprobs,
                                                 item.prompt_logprobs))
            return None
        finally:
            writer.close()
