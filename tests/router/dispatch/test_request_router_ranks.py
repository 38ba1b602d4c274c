"""KvRequestRouter.choose_replicas alone (Serve's own PendingRequest, stand-in replicas):
the ingress's ranking becomes one rank per preferred replica, then everyone else, and a
round where every replica is full backs off (Serve's loop retries at once otherwise)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from router.dispatch.request_router import RANK_KWARG, KvRequestRouter


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass(frozen=True)
class _Replica:
    replica_id: _Id


def _choose(replicas: list[_Replica], rank: list[str]) -> tuple[list[list[Any]], bool]:
    async def run() -> tuple[list[list[Any]], bool]:
        pending = PendingRequest(args=[], kwargs={RANK_KWARG: rank},
                                 metadata=RequestMetadata("r", "i"))
        assert pending.routing_context.should_backoff is False  # Serve's default
        # choose_replicas reads no router state: call it without building a router
        ranks = await KvRequestRouter.choose_replicas(
            None, replicas, pending)  # type: ignore[arg-type]
        return ranks, pending.routing_context.should_backoff

    return asyncio.run(run())


def test_preferred_replicas_come_first_then_the_rest() -> None:
    a, b, c = (_Replica(_Id(x)) for x in "abc")
    ranks, _ = _choose([a, b, c], ["c", "gone", "a"])
    assert ranks == [[c], [a], [b]]


def test_a_round_over_every_replica_backs_off() -> None:
    a, b = _Replica(_Id("a")), _Replica(_Id("b"))
    for rank in ([], ["a"], ["a", "b"]):
        assert _choose([a, b], rank)[1] is True
