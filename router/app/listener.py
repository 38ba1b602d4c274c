"""A router replica's own HTTP listener (``server.ingress: direct``).

Through Serve's proxy, every streamed event crosses two more processes' worth of work: the
replica hands each SSE write to Serve as one gRPC message, and the proxy's uvicorn writes it
again (docs/benchmarks.md, router overhead). With ``direct``, each router replica serves
``server.host:server.port`` itself. The socket has SO_REUSEPORT, so every router replica on a
node listens on the same port and the kernel spreads new connections over them (a
connection stays with its replica). Serve's proxy moves to a free loopback port
(``deploy/serve/runtime.py``).

Of what the proxy did, this keeps the request id: the client's ``x-request-id`` (if it is a
sane token) or a new one, set as Serve's request context, so the body id, logs and the echoed
header agree as they do through the proxy. Not kept: Serve's own queueing of requests to
router replicas; in its place each listener takes at most ``max_open`` requests at once
(``router.max_ongoing_requests`` + ``max_queued_requests``, what Serve would have taken and
queued) and answers the next with a fast 503 in the API's shape. The router's admission and
rate limits still apply. A replica that stops lets its open requests finish for
``graceful_s``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, MutableMapping
from typing import Any

from ray.serve import context as serve_context
from starlette.types import ASGIApp, Message, Receive, Send

from router.app.asgi_server import AsgiServer, address_of, bind
from router.app.edge import EdgeLimits
from router.errors import ApiError, error_response

_SANE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# the router replica's open requests, as it reports them to Serve's autoscaler
ONGOING_STAT = "kvroute_router_http_ongoing"


def request_id_of(scope: MutableMapping[str, Any]) -> str:
    """The client's ``x-request-id`` if it is a plain token, else a new one (a header
    echoed back must not carry what the client chose to put in it)."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _SANE_ID.fullmatch(value):
            return value.decode()
    return uuid.uuid4().hex


class RequestIds:
    """Serve's request context and the ``x-request-id`` response header, as the proxy sets
    them, for requests that do not pass the proxy; ``ongoing``, the requests open now (what
    Serve's autoscaler reads: ``deploy.autoscale.router``), at most ``max_open``."""

    def __init__(self, app: ASGIApp, app_name: str, max_open: int | None = None) -> None:
        self.app, self.app_name, self.max_open = app, app_name, max_open
        self.ongoing = 0

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive,
                       send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = request_id_of(scope)
        header = (b"x-request-id", rid.encode())
        # As Serve's RequestIdMiddleware: the id also travels on in the request's headers.
        scope = {**scope, "headers": [*((k, v) for k, v in scope["headers"]
                                        if k != b"x-request-id"), header]}
        # not is_http_request: Serve would then pass this request's handle calls as raw bytes
        serve_context._serve_request_context.set(serve_context._RequestContext(  # noqa: SLF001
            route=scope.get("path", ""), request_id=rid, app_name=self.app_name))

        def send_with_id(message: Message) -> Awaitable[None]:  # no frame of its own
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            return send(message)

        if self.max_open is not None and self.ongoing >= self.max_open:
            full = ApiError(503, "the router replica has too many open requests; retry later",
                            "overloaded", retry_after_s=1.0)
            return await error_response(full, scope.get("path", ""))(scope, receive,
                                                                     send_with_id)
        self.ongoing += 1
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.ongoing -= 1


class Listener:
    """The socket is bound at construction, so a taken port fails the replica's start with a
    clear error; ``start`` serves ``app`` on it."""

    def __init__(self, host: str, port: int, graceful_s: float = 15.0,
                 max_open: int | None = None, limits: EdgeLimits = EdgeLimits(),  # noqa: B008
                 keep_alive_s: float = 75.0) -> None:
        try:
            self._sock = bind(host, port, reuse_port=True)
        except OSError as e:
            raise RuntimeError(f"server.ingress 'direct': cannot listen on {host}:{port} ({e}); "
                               "another program holds the port") from None
        self.graceful_s, self.max_open = graceful_s, max_open
        self.limits, self.keep_alive_s = limits, keep_alive_s
        self._server: AsgiServer | None = None
        self._ids: RequestIds | None = None

    @property
    def address(self) -> str:
        return address_of(self._sock)

    @property
    def ongoing(self) -> int:
        """HTTP requests open on this listener now."""
        return 0 if self._ids is None else self._ids.ongoing

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.serving

    async def start(self, app: ASGIApp, app_name: str) -> None:
        self._ids = RequestIds(app, app_name, self.max_open)
        self._server = AsgiServer(self._ids, self._sock, self.graceful_s, self.limits,
                                  self.keep_alive_s)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        self._sock.close()
