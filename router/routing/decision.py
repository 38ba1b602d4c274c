"""One routing decision, clock-free: what ``RouterCore`` and ``kvroute sim`` both call.

Given the index's answer (matched blocks per replica), the replicas' reported load
and this router's own load view, a ``Decider`` builds the candidates, says whether
the request must wait at the router (admission), ranks the candidates through the
pipeline and lets stateful plugins learn from the pick. Every input that changes
with time comes in as an argument (``now``), so the offline simulator drives the
same code in virtual time and cannot drift from production
(``tests/ops/test_sim.py`` runs one trace through both and compares picks).

Effects on the outside world (the index's in-flight write, the load ticket, the
worker call) stay with the callers: ``router.dispatch.dispatch`` in production, the
simulator's replica emulators offline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cache_service.index import host_blocks
from router.routing.admission import AdmissionParams, backed_up
from router.routing.context import Candidate, RequestContext, build_candidate
from router.routing.load import LoadTracker, Ticket
from router.routing.pipeline import Pipeline, PipelineConfig
from router.routing.views import ReplicaInfo


class Decider:
    def __init__(self, routing: PipelineConfig, loads: LoadTracker, block_size: int,
                 prior_prefill_tok_s: float) -> None:
        self.pipeline = Pipeline(routing)
        self.admission: AdmissionParams | None = routing.admission
        self.loads, self.block_size, self.prior = loads, block_size, prior_prefill_tok_s

    def candidates(self, model: str, replicas: Iterable[ReplicaInfo],
                   matches: Mapping[str, int], now: float) -> list[Candidate]:
        """One candidate per replica: matched blocks, load merged from the report and this
        router's view (``router.routing.context.build_candidate``) at wall-clock ``now``."""
        out = []
        for info in replicas:
            matched = matches.get(info.replica, 0)
            out.append(build_candidate(
                model, info.replica, matched_blocks=matched, host_blocks=host_blocks(matched),
                block_size=self.block_size, local=self.loads.get(model, info.replica),
                reported=info.stats, prefill_tok_s=self.prior,
                max_ongoing=info.max_ongoing_requests, now=now,
            ))
        return out

    def must_wait(self, candidates: list[Candidate], others_waiting: bool) -> bool:
        """Admission: hold the request while every candidate is backed up, or while
        earlier requests wait (they leave first: shortest prefill first, with aging)."""
        if self.admission is None:
            return False
        return others_waiting or backed_up(candidates, self.admission)

    def rank(self, ctx: RequestContext, skip: str | None = None) -> list[Candidate]:
        """The pipeline's ranking (without replica ``skip``); plugins learn the pick."""
        ranked = self.pipeline.rank(ctx)
        if skip is not None:
            ranked = [c for c in ranked if c.replica != skip]
        if ranked:
            self.pipeline.on_routed(ctx, ranked[0])
        return ranked

    def begin(self, ctx: RequestContext, target: Candidate, now: float | None = None) -> Ticket:
        """The pick's load ticket: its uncached prompt counts as queued prefill."""
        return self.loads.begin(target.model, target.replica, ctx.uncached(target), now)
