"""A ``PrefixIndex`` that survives its primary (Redis) being slow or down.

* Every write also goes to a local ``MemoryPrefixIndex`` (this router's approximate view: its
  own routed writes plus whatever events/heartbeats reach this process).
* Reads and writes use the primary while it is healthy. A primary failure or timeout calls
  ``on_error(op)`` (the router increments ``kvroute_index_errors_total`` there), answers from
  the fallback, and opens a circuit: the primary is skipped for ``backoff_s``; after that a
  single probe call (others keep using the fallback meanwhile) decides whether it is back.
  So a dead Redis costs at most one timeout per ``backoff_s``, never one per request.
* Engine events the primary missed are owed too, kept in order (up to ``MAX_OWED_EVENTS``,
  oldest dropped beyond) and replayed before newer ones by the next ``apply_events`` or
  ``heartbeat``, in batches of ``EVENT_BATCH``: a worker whose Redis blinked would
  otherwise leave its blocks missing from the shared view until they were stored again.
* A removal (tombstone) the primary missed is owed, and retried by every later maintenance
  call (``remove_replica``, ``purge_dead``, ``stats``) until it lands: otherwise a replica the
  router saw die while Redis was unreachable would stay live in the shared view.
* Recovery is automatic: redis-py reconnects on the next command and reloads scripts on
  NOSCRIPT after a Redis restart; new writes fill the (possibly empty) primary again.

``lookup``, ``session``, the writes, ``heartbeat`` and the maintenance calls never
raise (bugs included: they are logged and counted); cancellation is propagated.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import TypeVar

from .breaker import CircuitBreaker
from .events import CacheEvent
from .index import IndexStats, MatchInfo, PrefixIndex
from .memory_index import MemoryPrefixIndex

__all__ = ["ResilientIndex"]

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_OWED_EVENTS = 100_000
EVENT_BATCH = 512


class ResilientIndex:
    def __init__(
        self,
        primary: PrefixIndex,
        fallback: MemoryPrefixIndex,
        on_error: Callable[[str], None] | None = None,
        backoff_s: float = 1.0,
        op_timeout_s: float = 0.25,
        maintenance_timeout_s: float = 0.5,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self._op_timeout_s = op_timeout_s  # hard cap on hot-path calls, on top of socket timeouts
        # and on maintenance calls: a Redis that trickles bytes never trips the socket
        # timeout, and must not hold the maintenance loop past its period
        self._maintenance_timeout_s = maintenance_timeout_s
        self.breaker = CircuitBreaker("prefix index", backoff_s, on_error,
                                      meanwhile="using the local fallback")
        self.errors: Counter[str] = Counter()
        self._owed_removals: set[tuple[str, str]] = set()
        self._owed_events: list[CacheEvent] = []
        self._settling_events = False

    @property
    def primary_healthy(self) -> bool:
        """False while the circuit is open (answers come from the fallback)."""
        return self.breaker.healthy

    def _record_error(self, op: str, exc: BaseException) -> None:
        self.errors[op] += 1
        self.breaker.failed(op, exc)

    async def _primary(
        self, op: str, call: Callable[[], Awaitable[T]], hot: bool = True
    ) -> tuple[bool, T | None]:
        """Run ``call`` on the primary unless the circuit is open; (ok, result)."""
        if not self.breaker.allow():
            return False, None
        try:
            async with asyncio.timeout(self._op_timeout_s if hot else
                                       self._maintenance_timeout_s):
                result = await call()
        except Exception as exc:
            self._record_error(op, exc)
            return False, None
        finally:
            self.breaker.release()  # a cancelled probe must not keep the circuit shut
        self.breaker.succeeded()
        return True, result

    async def _local(self, op: str, call: Callable[[], Awaitable[T]], default: T) -> T:
        try:
            return await call()
        except Exception:
            log.exception("local prefix index failed in %s", op)
            return default

    # ---- PrefixIndex ----------------------------------------------------------------------

    async def lookup(self, hashes_by_model: Mapping[str, Sequence[int]]) -> MatchInfo:
        ok, result = await self._primary("lookup", lambda: self.primary.lookup(hashes_by_model))
        if ok and result is not None:
            return result
        return await self._local("lookup", lambda: self.fallback.lookup(hashes_by_model), {})

    async def record_routed(self, model: str, replica: str, hashes: Sequence[int]) -> None:
        await self._local(
            "record_routed", lambda: self.fallback.record_routed(model, replica, hashes), None
        )
        await self._primary(
            "record_routed", lambda: self.primary.record_routed(model, replica, hashes)
        )

    async def apply_events(self, events: Sequence[CacheEvent]) -> None:
        await self._local("apply_events", lambda: self.fallback.apply_events(events), None)
        self._owed_events.extend(events)
        if (excess := len(self._owed_events) - MAX_OWED_EVENTS) > 0:
            del self._owed_events[:excess]  # the oldest; their entries age out by TTL
            self.errors["apply_events_dropped"] += excess
        await self._settle_events()

    async def _settle_events(self) -> None:
        """Replay owed events in order; one settler at a time (others just queued theirs)."""
        if self._settling_events:
            return
        self._settling_events = True
        try:
            while self._owed_events:
                batch = self._owed_events[:EVENT_BATCH]
                send = partial(self.primary.apply_events, batch)
                ok, _ = await self._primary("apply_events", send)
                if not ok:
                    return
                del self._owed_events[:len(batch)]
        finally:
            self._settling_events = False

    async def session(self, session_id: str) -> tuple[str, str] | None:
        ok, result = await self._primary("session", lambda: self.primary.session(session_id))
        if ok:
            return result
        return await self._local("session", lambda: self.fallback.session(session_id), None)

    async def record_session(self, session_id: str, model: str, replica: str) -> None:
        await self._local("record_session",
                          lambda: self.fallback.record_session(session_id, model, replica), None)
        await self._primary("record_session",
                            lambda: self.primary.record_session(session_id, model, replica))

    async def heartbeat(self, model: str, replica: str) -> None:
        await self._local("heartbeat", lambda: self.fallback.heartbeat(model, replica), None)
        await self._primary("heartbeat", lambda: self.primary.heartbeat(model, replica))
        await self._settle_events()  # a worker's periodic call: owed events go out even when idle

    async def live_replicas(self, model: str) -> set[str]:
        ok, result = await self._primary(
            "live_replicas", lambda: self.primary.live_replicas(model), hot=False
        )
        if ok and result is not None:
            return result
        return await self._local("live_replicas", lambda: self.fallback.live_replicas(model), set())

    async def remove_replica(self, model: str, replica: str) -> None:
        await self._local(
            "remove_replica", lambda: self.fallback.remove_replica(model, replica), None
        )
        self._owed_removals.add((model, replica))
        await self._settle_removals()

    async def _settle_removals(self) -> None:
        for model, replica in sorted(self._owed_removals):
            ok, _ = await self._primary(
                "remove_replica", partial(self.primary.remove_replica, model, replica), hot=False
            )
            if not ok:
                return
            self._owed_removals.discard((model, replica))

    async def purge_dead(self) -> int:
        await self._settle_removals()
        local = await self._local("purge_dead", self.fallback.purge_dead, 0)
        ok, count = await self._primary("purge_dead", self.primary.purge_dead, hot=False)
        return count if ok and count is not None else local

    async def stats(self) -> IndexStats:
        await self._settle_removals()
        ok, st = await self._primary("stats", self.primary.stats, hot=False)
        if ok and st is not None:
            return IndexStats(st.blocks, st.replicas, f"resilient({st.backend})")
        local = await self._local("stats", self.fallback.stats, IndexStats(0, 0, "memory"))
        return IndexStats(local.blocks, local.replicas, "resilient(memory-fallback)")

    async def close(self) -> None:
        for index in (self.primary, self.fallback):
            try:
                await index.close()
            except Exception:
                log.warning("closing %s failed", type(index).__name__, exc_info=True)
