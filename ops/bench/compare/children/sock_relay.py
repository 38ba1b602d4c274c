"""Byte relays between TCP on 127.0.0.1 and unix sockets (crossing a network namespace).

    python sock_relay.py tcp:127.0.0.1:8000=unix:/tmp/d/front.sock \\
        unix:/tmp/d/r0.sock=tcp:127.0.0.1:41234

Each ``LISTEN=TARGET`` pair accepts connections on LISTEN and pipes each one, both ways,
byte for byte, to a new connection to TARGET. Dynamo runs in a network namespace that has
only loopback (its ZMQ sockets bind 0.0.0.0, ``dynamo_peer``); unix sockets are files,
so they reach across: HTTP (client -> frontend, shim -> replica) and ZMQ's ZMTP stream
(replica's KV events -> shim) pass unchanged. Standard library only: it runs under
kvroute's python on the host and under Dynamo's inside the namespace. Prints ``ready``
once every listener is bound.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def opener(addr: str) -> Opener:
    kind, _, where = addr.partition(":")
    if kind == "unix":
        return lambda: asyncio.open_unix_connection(where)
    if kind == "tcp":
        host, _, port = where.rpartition(":")
        return lambda: asyncio.open_connection(host, int(port))
    raise SystemExit(f"not tcp:HOST:PORT or unix:PATH: {addr!r}")


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()


def handler(target: Opener) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                        Awaitable[None]]:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await target()
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    return relay


async def serve(pairs: list[tuple[str, str]]) -> None:
    servers = []
    for listen, target in pairs:
        kind, _, where = listen.partition(":")
        cb = handler(opener(target))
        if kind == "unix":
            servers.append(await asyncio.start_unix_server(cb, where))
        else:
            host, _, port = where.rpartition(":")
            servers.append(await asyncio.start_server(cb, host, int(port)))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str]) -> None:
    pairs = [tuple(a.split("=", 1)) for a in argv]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise SystemExit("usage: sock_relay.py LISTEN=TARGET ... (tcp:HOST:PORT, unix:PATH)")
    for listen, _ in pairs:  # a stale socket file of an earlier run
        if listen.startswith("unix:") and os.path.exists(listen[5:]):
            os.unlink(listen[5:])
    asyncio.run(serve([(p[0], p[1]) for p in pairs]))


if __name__ == "__main__":
    main(sys.argv[1:])
