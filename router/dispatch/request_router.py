"""The Serve ``RequestRouter`` on each worker deployment.

The ingress ranks (model, replica) candidates itself (prefix index + load) and
passes its ranking as the ``kvroute_rank`` keyword of the call. This router
honours it: one rank per preferred replica, then everyone else. Serve's base
class skips a rank whose replica is gone or at ``max_ongoing_requests`` and moves
to the next, so an overloaded or dead favourite costs no failure.

Each instance also registers itself (``router.routing.views``) as the replica view of its
deployment: the ingress reads the live replica set, pushed by Serve's controller
the moment replicas start or stop, and their routing stats, with no blocking call.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from router.routing import views

RANK_KWARG = views.RANK_KWARG  # the kwarg that carries the ingress's ranking


class KvRequestRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        views.register(self._deployment_id.name, self)

    def snapshot(self) -> list[views.ReplicaInfo]:
        replicas = list(self.curr_replicas.values())  # swapped whole by Serve, never mutated
        return [
            views.ReplicaInfo(
                r.replica_id.unique_id, r.max_ongoing_requests, dict(r.routing_stats or {})
            )
            for r in replicas
        ]

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        rank: list[str] = []
        if pending_request is not None:
            rank = list(pending_request.kwargs.get(RANK_KWARG) or [])
            # Every candidate is offered each round, so a round where all are full must back
            # off before the next: Serve retries at once when this is False (its default),
            # and a saturated deployment then spun probing queue lengths (108k probe
            # timeouts in minutes, the router replica starved past its health check).
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        ranks = [[by_id[rid]] for rid in rank if rid in by_id]
        ranked = set(rank)
        rest = [r for r in candidate_replicas if r.replica_id.unique_id not in ranked]
        if rest:
            ranks.append(rest)  # the base class picks the shortest queue among these
        return ranks
