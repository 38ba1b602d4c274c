"""The HTTP edge of a listener kvroute serves itself (``server.ingress: direct``, and each
worker's benchmark endpoint): what reaches the app must be a whole request head, soon.

uvicorn's httptools protocol, as configured by default, bounds none of these: a request
head may grow without limit (httptools appends every header piece), a connection that never
sends one is held forever (the keep-alive timer starts only after a first response), and
connections are only capped by the process's file descriptors. So here:

* a request head (request line and headers) over ``max_header_bytes`` is a 431, and the
  connection closes;
* a head not complete ``header_timeout_s`` after the connection opened (or, on a kept-alive
  connection, after the next request's first byte) closes the connection: idle floods and
  slowloris; a kept-alive connection idle between requests closes after ``keep_alive_s``;
* past ``max_connections`` open connections, or ``max_connections_per_client`` from one
  address, a new connection gets a 503 with ``retry-after`` and is closed. The total is
  also kept below the process's file-descriptor limit, so the router keeps descriptors for
  Redis, Serve and its replicas.

Behind Serve's proxy (``ingress: proxy``) these are the load balancer's to enforce
(docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from deploy.config import ServerConfig

# descriptors kept for everything else a router replica opens (Redis, Serve, gRPC, files)
FD_RESERVE = 1024


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    max_header_bytes: int = 64 << 10
    header_timeout_s: float = 10.0
    max_connections: int = 8192
    max_connections_per_client: int = 1024  # 0: no per-address cap (behind a balancer)

    @classmethod
    def of(cls, server: ServerConfig) -> EdgeLimits:
        return cls(server.max_header_bytes, server.header_timeout_s, server.max_connections,
                   server.max_connections_per_client)

    def connection_cap(self) -> int:
        """``max_connections``, or fewer where the descriptor limit is lower."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - FD_RESERVE))


def _reply(status: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n" + extra + b"\r\n" + body)


_TOO_LARGE = _reply(b"431 Request Header Fields Too Large", b'{"error": {"message": '
                    b'"request headers too large", "type": "invalid_request_error", '
                    b'"code": "headers_too_large"}}')
_FULL = _reply(b"503 Service Unavailable", b'{"error": {"message": "too many open connections; '
               b'retry later", "type": "overloaded", "code": "overloaded"}}', b"retry-after: 1\r\n")


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under ``limits``; ``edge_protocol`` makes one subclass per
    server, so the per-address counts are that server's."""

    limits: ClassVar[EdgeLimits] = EdgeLimits()
    cap: ClassVar[int] = EdgeLimits().max_connections
    per_client: ClassVar[Counter[str]] = Counter()
    _client_key: str | None = None
    _head_bytes = 0
    _in_head = True  # reading a request head (or waiting for one)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else ""
        if len(self.connections) > self.cap or (
                self.limits.max_connections_per_client
                and self.per_client[host] >= self.limits.max_connections_per_client):
            transport.write(_FULL)
            transport.close()
            return
        self._client_key = host
        self.per_client[host] += 1
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._client_key is not None:
            self.per_client[self._client_key] -= 1
            if self.per_client[self._client_key] <= 0:
                del self.per_client[self._client_key]
            self._client_key = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._cancel_head_timer()
            if not self.transport.is_closing():
                self.transport.write(_TOO_LARGE)
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a kept-alive connection's next request begins
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # Bytes from here on are the next request's head. Its deadline starts with its
        # first byte (an idle kept-alive connection is uvicorn's keep-alive timeout's).
        self._in_head, self._head_bytes = True, 0

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.transport.close()  # no whole request head in time: idle or slowloris


def edge_protocol(limits: EdgeLimits) -> type[EdgeProtocol]:
    """The protocol class for one server under ``limits``."""
    return type("EdgeProtocol", (EdgeProtocol,), {
        "limits": limits, "cap": limits.connection_cap(), "per_client": Counter()})
