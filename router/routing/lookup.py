"""What one routing decision starts from: the prompt's block hashes, one index lookup for
every candidate model, the candidates Serve's view gives, and the wait at the router
while every candidate is backed up.

``RouterCore`` calls these with itself as the ``Parts``: its index, decider, pre-warm and
gate stay its attributes, so ``kvroute sim``'s lockstep test can swap them in one place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from cache_service.hashing import block_hashes, tenant_salt
from cache_service.index import PrefixIndex
from deploy.config import KvrouteConfig
from router import metrics, telemetry
from router.errors import ApiError
from router.routing.admission import AdmissionGate, own_prefill_s
from router.routing.context import Candidate, RequestContext
from router.routing.decision import Decider
from router.routing.prewarm import Prewarmer
from router.routing.selection import RouteRequest, request_context
from router.routing.views import replica_view

_VIEW_WAIT_S = 10.0


class Parts(Protocol):
    """The routing state a decision reads (``RouterCore``'s attributes)."""

    config: KvrouteConfig
    index: PrefixIndex
    decider: Decider
    prewarm: Prewarmer
    gate: AdmissionGate | None
    salts: dict[str, int]
    clock: Callable[[], float]  # wall-clock time, for worker reports
    monotonic: Callable[[], float]  # the plugins' own time (virtual in kvroute sim)


def hashes(parts: Parts, token_ids: list[int], models: Mapping[str, float],
           tenant: str | None = None) -> dict[str, list[int]]:
    """Each model's block hashes, salted by the model and (isolation on) the tenant."""
    bs = parts.config.index.block_size
    return {m: block_hashes(token_ids, bs, tenant_salt(parts.salts[m], tenant)) for m in models}


async def context(parts: Parts, req: RouteRequest, weights: Mapping[str, float],
                  blocks: dict[str, list[int]]) -> RequestContext:
    """The index's matches (one round trip for every candidate model, the session's read
    alongside) and the candidates, as the pipeline sees them."""
    started = time.perf_counter()
    with telemetry.TRACER.start_as_current_span("index.lookup") as span:
        match, sticky = await asyncio.gather(parts.index.lookup(blocks),
                                             _sticky(parts.index, req.session_id))
        span.set_attribute("kvroute.blocks", len(next(iter(blocks.values()))))
    metrics.LOOKUP.observe(time.perf_counter() - started)
    for m in weights:  # what pre-warm sends new replicas (router.routing.prewarm)
        parts.prewarm.observe(m, req.tenant, req.token_ids, blocks[m], match.get(m, {}))
    cands = await _all_candidates(parts, weights, match)
    if req.sampling.prompt_logprobs is not None:  # the engine prefills it all: no hit counts
        for c in cands:
            c.matched_tokens = c.host_tokens = 0
    return request_context(parts.config, req, weights, blocks, cands, sticky,
                           prompt_tokens=len(req.token_ids), now=parts.monotonic())


async def _sticky(index: PrefixIndex, session_id: str | None) -> tuple[str, str] | None:
    return await index.session(session_id) if session_id else None


async def _all_candidates(parts: Parts, weights: Mapping[str, float],
                          match: Mapping[str, Mapping[str, int]]) -> list[Candidate]:
    cands = [c for m in weights for c in candidates(parts, m, match.get(m, {}))]
    deadline = asyncio.get_running_loop().time() + _VIEW_WAIT_S
    while not cands and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # replicas starting, or this handle just initialised
        cands = [c for m in weights for c in candidates(parts, m, match.get(m, {}))]
    if not cands:
        raise ApiError(503, f"no ready replica of {', '.join(weights)}", "no_replica", None, 5)
    return cands


def candidates(parts: Parts, model: str, matches: Mapping[str, int]) -> list[Candidate]:
    view = parts.prewarm.admit(model, replica_view(model))  # none being warmed
    return parts.decider.candidates(model, view, matches, parts.clock())


async def wait_if_backed_up(parts: Parts, ctx: RequestContext,
                            weights: Mapping[str, float]) -> bool:
    """Wait at the router while every candidate is backed up; True if it waited."""
    gate = parts.gate
    assert gate is not None
    models = tuple(weights)
    if not parts.decider.must_wait(ctx.candidates, gate.holding(models)):
        return False  # the common case, decided on the candidates already built

    def ready() -> bool:
        cands = [c for m in weights for c in candidates(parts, m, {})]
        return not parts.decider.must_wait(cands, False)

    with telemetry.TRACER.start_as_current_span("admission") as span:
        metrics.ADMISSION_HELD.set(gate.held + 1)
        try:
            waited = await gate.admit(models, own_prefill_s(ctx), ready)
        finally:
            metrics.ADMISSION_HELD.set(gate.held)
        span.set_attribute("kvroute.admission_wait_s", waited)
    return waited > 0
