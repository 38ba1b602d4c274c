"""RouterCore's housekeeping against the memory index: a replica this router routed to
is purged from the shared view once Serve's view no longer has it, even if it died
before any maintenance tick saw it (CI caught that race on real Serve)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from deploy.config import KvrouteConfig
from router.core import RouterCore
from router.routing import views
from tests.stacks import sim_model

MODEL = "sim-core"


class View:
    def __init__(self, *replicas: str) -> None:
        self.replicas = list(replicas)

    def snapshot(self) -> list[views.ReplicaInfo]:
        return [views.ReplicaInfo(r, 8, {}) for r in self.replicas]


def test_a_replica_routed_to_and_gone_before_a_tick_is_purged(tiny_model_dir: Path) -> None:
    core = RouterCore(KvrouteConfig(models=[sim_model(MODEL, tiny_model_dir)]), {})
    views.register(MODEL, View("alive"))

    async def run() -> tuple[set[str], set[str]]:
        await core.index.record_routed(MODEL, "short-lived", [1, 2, 3])  # it holds entries
        await core.index.record_routed(MODEL, "alive", [4])
        core.housekeeping.remember(MODEL, "short-lived")  # what dispatch does when it routes there
        before = await core.index.live_replicas(MODEL)
        await core.maintain()  # Serve's view never showed it: it died first
        return before, await core.index.live_replicas(MODEL)

    try:
        before, after = asyncio.run(run())
    finally:
        views.register(MODEL, View())
    assert before == {"short-lived", "alive"}
    assert after == {"alive"}
