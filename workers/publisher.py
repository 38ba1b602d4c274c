"""Moves a replica's cache events to the prefix index.

With a shared (Redis) index the replica publishes by itself: a background task
flushes events in batches and sends heartbeats. With the embedded memory index
there is nothing shared to write to, so events ride back to the router on each
response (``workers.protocol.Final.events``) and the router applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cache_service.index import PrefixIndex
from workers.protocol import Engine

log = logging.getLogger(__name__)


class IndexPublisher:
    """Background task: batch engine events into the shared index; heartbeat."""

    def __init__(
        self, engine: Engine, index: PrefixIndex, model: str, replica: str,
        flush_s: float = 0.05, heartbeat_s: float = 2.0,
    ) -> None:
        self._engine, self._index = engine, index
        self._model, self._replica = model, replica
        self._flush_s, self._heartbeat_s = flush_s, heartbeat_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        since_beat = self._heartbeat_s
        while True:
            if since_beat >= self._heartbeat_s:
                await self._index.heartbeat(self._model, self._replica)
                since_beat = 0.0
            await self.flush()
            await asyncio.sleep(self._flush_s)
            since_beat += self._flush_s

    async def flush(self) -> None:
        if events := self._engine.drain_cache_events():
            await self._index.apply_events(events)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.flush()
            await self._index.remove_replica(self._model, self._replica)
        await self._index.close()
