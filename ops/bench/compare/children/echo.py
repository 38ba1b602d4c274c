"""A trivial echo endpoint, to measure Ray Serve's own proxy overhead.

The same few bytes come back either from a Serve deployment behind Serve's HTTP
proxy (``EchoDeployment``), or from a plain uvicorn process serving ``echo_app``
(``python -m ops.bench.compare.children.echo PORT``). The difference is what Serve's proxy and
its hop into a replica cost, with no kvroute code in the path.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

BODY = b'{"ok":true}'
ECHO_APP, ECHO_ROUTE = "kvroute-bench-echo", "/kvroute-bench-echo"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Raw ASGI: 200 with ``BODY`` for any HTTP request."""
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class EchoDeployment:
    async def __call__(self, request: Request) -> Response:
        return Response(BODY, media_type="application/json")


def main(argv: list[str]) -> None:
    import uvicorn

    uvicorn.run(echo_app, host="127.0.0.1", port=int(argv[0]), log_level="warning",
                access_log=False, lifespan="off")


if __name__ == "__main__":
    main(sys.argv[1:])
