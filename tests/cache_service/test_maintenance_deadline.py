"""Maintenance calls were bounded only by Redis's socket timeout (50 ms
per command). A slow Redis that answers every command just under it still holds a call
for as many round trips as it makes: ``stats`` makes one per model, so with 40 models a
maintenance tick took over a second, longer than its period. Each maintenance call now has
its own deadline (``index.maintenance_timeout_s``, under ``router.maintenance_s``).

A real ``RouterCore`` and ``ResilientIndex`` against a slow RESP server on loopback that
answers each command after 50 ms (socket timeout 0.5 s here, so no single command fails
even on a loaded machine): the 5th maintenance tick purges, then gives up on ``stats`` at
the deadline (before, it made all 41 round trips, ~2 s against a 1 s period); routing
lookups answer afterwards."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from deploy.config import IndexConfig, KvrouteConfig, RouterConfig
from router.core import RouterCore
from router.routing import views
from tests.stacks import sim_model

MODEL = "sim-maint"
MODELS = 40  # what the slow server says the index holds: stats() makes one call per model
DELAY_S = 0.05  # far under the test's 0.5 s socket timeout: every single command succeeds


class View:
    def __init__(self, *replicas: str) -> None:
        self.replicas = list(replicas)

    def snapshot(self) -> list[views.ReplicaInfo]:
        return [views.ReplicaInfo(r, 8, {}) for r in self.replicas]


class SlowRedis:
    """Answers each RESP command after ``DELAY_S``: HGETALL with ``MODELS`` models, the
    index's scripts with empty results, anything else +OK. Counts what it answered."""

    def __init__(self) -> None:
        self.answered = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while command := await _read_command(reader):
                await asyncio.sleep(DELAY_S)
                writer.write(_reply(command))
                await writer.drain()
                self.answered += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes]:
    header = await reader.readline()
    if not header:
        return []
    out = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        out.append((await reader.readexactly(size + 2))[:-2])
    return out


def _reply(command: list[bytes]) -> bytes:
    name = command[0].upper()
    if name == b"HGETALL":
        pairs = [x for i in range(MODELS) for x in (f"t{i}", f"m{i}")]
        return f"%{MODELS}\r\n".encode() + b"".join(  # RESP3 map: the client speaks 3
            f"${len(x)}\r\n{x}\r\n".encode() for x in pairs)
    if name in (b"EVALSHA", b"EVAL") and int(command[2]) > 10:
        return b":0\r\n"  # PURGE_DEAD (keys of every model): nothing purged
    if name in (b"EVALSHA", b"EVAL"):
        return b"*2\r\n$0\r\n\r\n:0\r\n"  # LIVE_AND_COUNT: no live replica, 0 entries
    return b"+OK\r\n"


async def test_a_slow_redis_cannot_hold_up_maintenance(tiny_model_dir: Path) -> None:
    server = SlowRedis()  # in the test's own event loop, where the index runs
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{listener.sockets[0].getsockname()[1]}/0"
    cfg = KvrouteConfig(models=[sim_model(MODEL, tiny_model_dir)],
                        index=IndexConfig(redis_url=url, timeout_s=0.5, op_timeout_s=0.5,
                                          maintenance_timeout_s=0.9),
                        router=RouterConfig(maintenance_s=1.0))
    core = RouterCore(cfg, {})
    views.register(MODEL, View("alive"))
    core.housekeeping.ticks = 4  # the 5th tick also purges and reads stats
    try:
        start = time.monotonic()
        await asyncio.wait_for(core.maintain(), 10.0)
        took = time.monotonic() - start
        lookups = [await asyncio.wait_for(core.index.lookup({MODEL: [1, 2, 3]}), 2.0)
                   for _ in range(3)]
    finally:
        views.register(MODEL, View())
        await core.close()
        listener.close()
    print(f"maintenance tick against a Redis answering in {DELAY_S * 1e3:.0f} ms: "
          f"{took:.2f} s, {server.answered} commands answered")
    assert all(isinstance(x, dict) for x in lookups)
    # stats() gave up at its deadline (before: all 1 + MODELS of its round trips, > 1 s)
    # Under heavy load purge_dead, which runs first, can hit its own deadline; that opens
    # the breaker and stats() is skipped, which bounds the tick just as well.
    errors = core.index.errors  # type: ignore[attr-defined]
    assert errors["stats"] == 1 or (errors["stats"] == 0 and errors["purge_dead"] >= 1), errors
    assert server.answered < MODELS


def test_the_deadline_stays_under_the_period() -> None:
    with pytest.raises(ValueError, match="maintenance_timeout_s"):
        KvrouteConfig(models=[{"name": "m", "engine": "sim", "model_path": "x"}],
                      index=IndexConfig(maintenance_timeout_s=2.0))
