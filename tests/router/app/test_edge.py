"""The HTTP edge (``router.app.edge``) on a real uvicorn server on 127.0.0.1: oversized heads,
slowloris, idle floods and connection caps leave another client's requests served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from router.app.asgi_server import AsgiServer, bind
from router.app.edge import EdgeLimits

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the server fixture's loop
LIMITS = EdgeLimits(max_header_bytes=8192, header_timeout_s=0.5, max_connections=12,
                    max_connections_per_client=8)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive())["more_body"] if scope["method"] == "POST" else False:
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest_asyncio.fixture
async def server() -> AsyncIterator[AsgiServer]:
    srv = AsgiServer(app, bind("127.0.0.1"), graceful_s=0.5, limits=LIMITS, keep_alive_s=5)
    await srv.start()
    yield srv
    await srv.stop()


async def served(srv: AsgiServer) -> bool:
    """Another client's request, on a connection of its own."""
    async with httpx.AsyncClient(base_url=f"http://{srv.address}", timeout=5) as client:
        r = await client.get("/health")
        return r.status_code == 200 and r.text == "ok"


async def closed_by_server(reader: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """What the server sent before it closed the connection (raises if it stays open)."""
    return await asyncio.wait_for(reader.read(), within_s)


async def test_an_oversized_head_is_a_431_and_the_connection_closes(server: AsgiServer) -> None:
    host, port = server.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n")
    for _ in range(9):  # 9 KiB of headers that never end, past the 8 KiB bound
        writer.write(b"x-big: " + b"a" * 1024 + b"\r\n")
    await writer.drain()
    reply = await closed_by_server(reader)
    assert reply.startswith(b"HTTP/1.1 431 ")
    # A client that goes on sending is cut off too (reset: the server stopped reading).
    reader, writer = await asyncio.open_connection(host, int(port))
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        for _ in range(32 << 10):  # 32 MiB, as the attack sent
            writer.write(b"x-big: " + b"a" * 1024 + b"\r\n")
            await writer.drain()
        await closed_by_server(reader)
    assert await served(server)
    writer.close()


async def test_a_head_within_the_bound_is_served(server: AsgiServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        r = await client.get("/", headers={"x-fine": "a" * 6000})
    assert r.status_code == 200


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: "])
async def test_idle_and_slowloris_connections_are_closed(server: AsgiServer, sent: bytes) -> None:
    host, port = server.address.rsplit(":", 1)
    conns = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
    for _, writer in conns:
        writer.write(sent)
        await writer.drain()
    for reader, writer in conns:
        if sent:  # a slowloris's next byte, late: the head's deadline holds regardless
            writer.write(b"a")
        assert await closed_by_server(reader, within_s=3.0) == b""
        writer.close()
    assert await served(server)


async def test_a_kept_alive_connection_serves_one_request_after_another(
        server: AsgiServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        for _ in range(3):
            assert (await client.post("/", content=b"x" * 10)).status_code == 200
            await asyncio.sleep(0.7)  # longer than the head timeout: idle, not late


async def test_past_the_per_client_cap_a_connection_gets_a_503(server: AsgiServer) -> None:
    host, port = server.address.rsplit(":", 1)
    held = [await asyncio.open_connection(host, int(port))
            for _ in range(LIMITS.max_connections_per_client)]
    reader, writer = await asyncio.open_connection(host, int(port))
    reply = await closed_by_server(reader)
    assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply
    writer.close()
    for _, w in held:
        w.close()
    await asyncio.sleep(0.1)
    assert await served(server)  # the address's count went down with its connections


async def test_the_connection_cap_stays_below_the_descriptor_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (4096, 4096))
    assert EdgeLimits(max_connections=8192).connection_cap() == 4096 - 1024
    assert EdgeLimits(max_connections=100).connection_cap() == 100
