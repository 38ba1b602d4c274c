"""A replica's bound on loopback calls (``workers.deployment.LoopbackCalls``): Serve's
calls and loopback calls share ``max_ongoing_requests``; a stopping replica takes no
call and lets the open ones finish, up to its drain time."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from workers.deployment import LoopbackCalls


def calls(limit: int, serve_calls: int = 0) -> tuple[LoopbackCalls, Any]:
    worker = SimpleNamespace(_serve_calls=serve_calls)
    return LoopbackCalls(worker, "r1", limit), worker  # type: ignore[arg-type]


def test_serve_calls_and_loopback_calls_share_the_bound() -> None:
    c, worker = calls(3, serve_calls=1)
    assert c.admit() and c.admit()
    assert not c.admit()  # 1 Serve call + 2 loopback calls
    worker._serve_calls = 0
    assert c.admit() and not c.admit()
    c.release()
    assert c.admit()
    assert (c.open, c.total) == (3, 4)


async def test_a_stopping_replica_refuses_calls_and_drains_the_open_ones() -> None:
    c, _ = calls(4)
    assert c.admit()
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, c.release)
    t0 = time.monotonic()
    await c.drain(10)
    assert 0.15 < time.monotonic() - t0 < 5 and c.open == 0
    assert not c.admit()


async def test_drain_gives_up_at_its_time() -> None:
    c, _ = calls(4)
    assert c.admit()
    t0 = time.monotonic()
    await c.drain(0.2)
    assert time.monotonic() - t0 < 5 and c.open == 1
