"""The router's once-a-second tick over Serve's view: purge replicas Serve removed from the
index, forget their load, publish the replicas' gauges and (every 5th tick) the index's
own stats; and the per-replica report ``/kvroute/replicas`` shows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from cache_service.index import PrefixIndex
from router import metrics
from router.routing.load import LoadTracker
from router.routing.prewarm import Prewarmer
from router.routing.views import replica_view


class Housekeeping:
    """Replicas known to this router, and the tick that keeps the index in step with them.

    ``forget`` drops what the dispatcher keeps per replica (it is given the live ones)."""

    def __init__(self, models: Iterable[str], forget: Callable[[set[str]], None]) -> None:
        self.models, self.forget = list(models), forget
        self.known: dict[str, set[str]] = {}
        self.ticks = 0

    def remember(self, model: str, replica: str) -> None:
        """Known replicas are purged from the index once Serve's view drops them; one
        routed to and dead before the next maintenance tick must be known too."""
        self.known.setdefault(model, set()).add(replica)

    async def tick(self, index: PrefixIndex, prewarm: Prewarmer, loads: LoadTracker) -> None:
        """Purge replicas Serve removed; forget their load. Runs every second."""
        live: set[tuple[str, str]] = set()
        for model in self.models:
            view = replica_view(model)
            prewarm.admit(model, view)  # warm-ups start on a quiet router too
            for info in view:
                metrics.ONGOING.labels(model, info.replica).set(
                    info.stats.get("ongoing_requests", 0))
                metrics.QUEUED.labels(model, info.replica).set(
                    info.stats.get("queued_prefill_tokens", 0))
            now = {info.replica for info in view}
            for gone in sorted(self.known.get(model, set()) - now):
                await index.remove_replica(model, gone)
                with contextlib.suppress(KeyError):
                    metrics.ONGOING.remove(model, gone)
                    metrics.QUEUED.remove(model, gone)
            self.known[model] = now
            live |= {(model, r) for r in now}
        loads.forget(live)
        self.forget({r for _, r in live})
        self.ticks += 1
        if self.ticks % 5 == 0:  # index stats cost a Redis call: every 5 s is plenty
            # replicas whose heartbeats stopped (a node lost while no router watched it)
            await index.purge_dead()
            stats = await index.stats()
            metrics.INDEX_BLOCKS.set(stats.blocks)
            metrics.INDEX_REPLICAS.set(stats.replicas)

    def replica_stats(self, loads: LoadTracker) -> dict[str, list[dict[str, Any]]]:
        """Each replica's own report, plus ``router_ongoing``: the requests this router
        replica has on it now (its load view: tickets begun and not yet ended)."""
        return {
            name: [{"replica": i.replica, "max_ongoing_requests": i.max_ongoing_requests,
                    **i.stats, "router_ongoing": loads.get(name, i.replica).ongoing}
                   for i in replica_view(name)]
            for name in self.models
        }

    def ready(self) -> dict[str, int]:
        return {name: len(replica_view(name)) for name in self.models}
