"""The router's own end-to-end deadline and client-disconnect watch.

Ray Serve's proxy honours two client headers before kvroute runs:
``x-request-timeout-seconds`` (``0`` lifts ``http_options.request_timeout_s``) and
``x-request-disconnect-disabled: ?1`` (the proxy stops cancelling the request when the
client leaves). Neither is kvroute's to trust, so this ASGI middleware does both jobs
itself, on every request, whatever the proxy was told:

- a deadline of ``server.request_timeout_s`` from the moment the router gets the request:
  over it, the handler is cancelled (which cancels the worker request) and the client gets
  a 408 in the API's shape, or, mid-stream, a cut stream (what Serve's proxy does);
- a watch on ``receive()`` once the body has been read: the proxy still forwards the
  client's ``http.disconnect`` with the header set (it only stops acting on it), so the
  handler is cancelled as soon as it arrives, even when nothing is being streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import ClientDisconnect

from router import telemetry
from router.errors import ApiError, error_response

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]
DISCONNECT: Message = {"type": "http.disconnect"}


class _Client:
    """One request's view of its client: owns ``receive`` once the body is in."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.body_read = asyncio.Event()
        self.gone = asyncio.Event()
        self.started = False

    async def receive(self) -> Message:
        """What the app calls: the body as it comes, then a wait for the disconnect."""
        if self.body_read.is_set():  # the watcher owns the real receive from here on
            await self.gone.wait()
            return DISCONNECT
        msg = await self._receive()
        if msg["type"] == "http.disconnect":
            self.gone.set()
        elif not msg.get("more_body", False):
            self.body_read.set()
        return msg

    async def watch(self) -> None:
        """Returns when the client has left (after its body was read)."""
        await self.body_read.wait()
        try:
            while (await self._receive())["type"] != "http.disconnect":
                pass
        except Exception:  # the transport failed: keep the deadline only
            return
        self.gone.set()


class ClientGuardMiddleware:
    """Deadline and disconnect watch for every HTTP request (see the module docstring).

    The deadline is read from ``app.state.request_timeout_s`` (set by the ingress from the
    config; None or unset = no deadline of our own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive,
                       send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = getattr(scope.get("app"), "state", None)
        timeout_s: float | None = getattr(state, "request_timeout_s", None)
        client = _Client(receive)

        def send_tracked(message: Message) -> Awaitable[None]:  # no frame of its own
            client.started = client.started or message["type"] == "http.response.start"
            return send(message)

        handler = asyncio.ensure_future(self.app(scope, client.receive, send_tracked))
        watcher = asyncio.ensure_future(client.watch())
        try:
            await _until_done_gone_or_late(handler, watcher, client, timeout_s)
            if handler.done():
                return _result(handler)
            await _cancel(handler)
            if client.gone.is_set():
                telemetry.current().client_gone = True  # a 499, never the server's error
                return  # nobody to answer
            if client.started:
                return  # a stream to cut (as Serve's proxy does)
            err = ApiError(408, f"request not finished within {timeout_s} s "
                           "(server.request_timeout_s)", "request_timeout")
            await error_response(err, scope["path"])(scope, client.receive, send)
        finally:  # also when Serve cancels us (the proxy saw the disconnect itself)
            await _cancel(watcher)
            await _cancel(handler)


def _result(handler: asyncio.Future[None]) -> None:
    """The app's outcome; a client that left while its body was read (Starlette's
    ``ClientDisconnect``) is that client's doing: counted as a 499, with no traceback."""
    try:
        return handler.result()
    except ClientDisconnect:
        telemetry.current().client_gone = True


async def _until_done_gone_or_late(handler: asyncio.Future[None], watcher: asyncio.Future[None],
                                   client: _Client, timeout_s: float | None) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    pending = {handler, watcher}
    while not handler.done() and not client.gone.is_set():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            return
        await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        pending = {handler}  # a watcher that ended without a disconnect watches no more


async def _cancel(task: asyncio.Future[Any]) -> None:
    if task.done():
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
