"""uvicorn serving an ASGI app inside a Serve replica's event loop, on a socket bound first.

Used by a worker replica's direct endpoint (``router/app/replica_endpoint.py``) and by a
router
replica's own listener (``router/app/listener.py``). The socket is bound before the server starts,
so there is no port race; uvicorn's signal capture is off, since the replica process, not
this server, owns SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from router.app.edge import EdgeLimits, edge_protocol

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0


class _Server(uvicorn.Server):
    """uvicorn without signal capture: the replica owns the process's signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int = 0, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port). ``reuse_port``: SO_REUSEPORT, so
    several processes of this user can listen on one port and the kernel spreads connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


class AsgiServer:
    """``app`` served on ``sock`` until ``stop``; ``graceful_s``: how long ``stop`` lets open
    requests finish before it closes them; ``limits``: the HTTP edge's (``router.app.edge``)."""

    def __init__(self, app: Any, sock: socket.socket, graceful_s: float = 10.0,
                 limits: EdgeLimits = EdgeLimits(), keep_alive_s: float = 75.0) -> None:  # noqa: B008 - frozen
        self.sock, self.graceful_s = sock, graceful_s
        self._server = _Server(uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=graceful_s,
            http=edge_protocol(limits)))
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return address_of(self.sock)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Serve; returns once the server accepts (raises if it cannot start)."""
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self.sock]))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self.sock.close()
                self._task.result()  # raises the server's startup error
                raise RuntimeError("HTTP server exited during startup")
            if time.monotonic() > deadline:
                await self.stop()
                raise TimeoutError("HTTP server did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, let open requests finish for up to ``graceful_s``, then close."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self.graceful_s + 5.0)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:  # the server failed; it is stopped either way
            log.exception("HTTP server failed")
        self._task = None
        self.sock.close()
