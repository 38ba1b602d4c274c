"""What ``kvroute bench autoscale`` watches while its load runs: the replica count over
time (from Serve's status) and what each scale-down throws away of the prefix cache (from
the Redis index: the blocks only the stopped replica held).

Serve 2.60 picks the replicas to stop itself (``deployment_scheduler._get_replicas_to_stop``:
not yet running first, then by node: not the head node, fewest replicas; then newest first);
neither an autoscaling policy (it returns a count) nor the router can choose. So the cost is
measured, with what stopping the replica of least exclusive cache would have lost beside it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np

from cache_service import RedisPrefixIndex


@dataclass(frozen=True, slots=True)
class ScaleDown:
    t: float  # seconds from the start of the load
    replicas: tuple[str, ...]  # the replicas that went at once
    held_blocks: int  # what they held in the index just before they went
    lost_blocks: int  # of those, held by no replica that stayed
    least_lost_blocks: int  # had the same number gone, chosen to lose the least
    fleet_blocks: int  # distinct blocks the fleet held then


def lost(held: dict[str, set[int]], gone: Collection[str]) -> int:
    """Blocks that only replicas in ``gone`` held."""
    kept = set().union(*(b for r, b in held.items() if r not in gone))
    return len(set().union(*(held[r] for r in gone)) - kept)


def least_lost(held: dict[str, set[int]], k: int, max_sets: int = 5000) -> int:
    """The fewest blocks ``k`` stopped replicas could have lost (all choices up to
    ``max_sets``; beyond, the ``k`` of least exclusive holdings)."""
    if math.comb(len(held), k) <= max_sets:
        return min(lost(held, c) for c in itertools.combinations(held, k))
    return lost(held, sorted(held, key=lambda r: lost(held, (r,)))[:k])


def _count_replicas(states: dict[str, int]) -> tuple[int, int]:
    """(running, running + starting): Serve's replica states of one deployment."""
    def name(state: Any) -> str:
        return str(getattr(state, "value", state))

    running = sum(n for s, n in states.items() if name(s) == "RUNNING")
    return running, sum(n for s, n in states.items() if name(s) != "STOPPING")


@dataclass(slots=True)
class Watch:
    """Samples until ``stop``: replicas every ``period_s``, the index every ``index_s``."""

    url: str
    model: str
    app: str
    index: RedisPrefixIndex
    period_s: float = 0.5
    index_s: float = 1.0
    t0: float = field(default_factory=time.monotonic)
    replicas: list[tuple[float, int, int]] = field(default_factory=list)  # t, running, total
    cpu_busy: list[float] = field(default_factory=list)  # the machine's, all cores, 0..1
    scale_downs: list[ScaleDown] = field(default_factory=list)
    _holdings: dict[str, set[int]] = field(default_factory=dict)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> list[asyncio.Task[None]]:
        self.t0 = time.monotonic()
        return [asyncio.ensure_future(self._replica_loop()),
                asyncio.ensure_future(self._index_loop())]

    def stop(self) -> None:
        self._stop.set()

    async def _sleep(self, s: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), s)
            return False
        except TimeoutError:
            return True

    async def _replica_loop(self) -> None:
        import psutil

        from deploy.cli.console import serve_replica_states

        psutil.cpu_percent(None)  # the first call only starts the interval
        while True:
            states = await asyncio.to_thread(serve_replica_states, self.app)
            self.cpu_busy.append(psutil.cpu_percent(None) / 100)
            running, total = _count_replicas(states.get(self.model, {}))
            self.replicas.append((time.monotonic() - self.t0, running, total))
            if not await self._sleep(self.period_s):
                return

    async def _index_loop(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                await self._index_tick(http)
                if not await self._sleep(self.index_s):
                    return

    async def _index_tick(self, http: aiohttp.ClientSession) -> None:
        try:
            async with http.get(f"{self.url}/kvroute/replicas") as r:
                data = await r.json() if r.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        live = {x["replica"] for x in data.get("models", {}).get(self.model, [])}
        if not live:
            return
        gone = set(self._holdings) - live
        if gone:
            self._record(gone)
        self._holdings = {rid: await self.index.held_blocks(self.model, rid) for rid in live}

    def _record(self, gone: set[str]) -> None:
        """Replicas that left since the last tick, against the holdings seen then."""
        held = self._holdings
        self.scale_downs.append(ScaleDown(
            time.monotonic() - self.t0, tuple(sorted(gone)),
            len(set().union(*(held[r] for r in gone))), lost(held, gone),
            least_lost(held, len(gone)), len(set().union(*held.values()))))

    def replica_seconds(self, until_s: float) -> float:
        """Replicas running or starting, integrated over [0, until_s]."""
        total, pts = 0.0, [p for p in self.replicas if p[0] <= until_s]
        for (t, _, n), nxt in zip(pts, [*pts[1:], (until_s, 0, 0)], strict=True):
            total += n * (nxt[0] - t)
        return total

    def summary(self) -> dict[str, Any]:
        cpu = self.cpu_busy or [0.0]
        return {
            # the whole machine's (other users included): whether CPU, not the emulated
            # prefill, could have bounded TTFT (docs/deploy.md, "sleep-bound")
            "cpu_busy_mean": float(np.mean(cpu)),
            "cpu_busy_p90": float(np.percentile(cpu, 90)),
            "replicas_over_time": [[round(t, 2), r, n] for t, r, n in self.replicas],
            "scale_downs": [asdict(s) for s in self.scale_downs],
            "scale_down_lost_blocks": sum(s.lost_blocks for s in self.scale_downs),
            "scale_down_least_lost_blocks": sum(s.least_lost_blocks for s in self.scale_downs),
        }
