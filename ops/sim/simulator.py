"""The event loop of ``kvroute sim``: production routing against engine emulators.

Every request of the trace arrives at ``(timestamp - first timestamp) / speedup``
seconds of virtual time. At each arrival the simulator does what ``RouterCore``
does, with the same code (``router.routing.decision.Decider``):

1. ``MemoryPrefixIndex.lookup`` of the request's ``hash_ids`` (used directly as
   block hashes: one per 512-token block, chained, as the trace defines them);
2. one ``Candidate`` per replica from ``router.routing.context.build_candidate``: matched
   blocks from the index; load merged from this router's ``LoadTracker`` view and
   the replica's routing stats (``SimCore.load().routing_stats()``: remaining
   prefill, cumulative prefill counters), as Serve delivers them: taken every
   ``stats_period_s`` (jittered like Serve's controller), seen ``stats_delay_s``
   later;
3. ``Pipeline.rank`` with the named profile, then ``on_routed`` (baselines learn
   their approximate trees there), ``LoadTracker.begin`` and the index's in-flight
   ``record_routed`` write, then ``SimCore.submit`` on the chosen replica.

If the profile has ``admission`` (``kvroute`` does), an arriving request may first wait
in the router's ``HoldQueue`` (``router.routing.admission``), re-checked every ``tick_s``; it is
routed as above when released, and its TTFT still counts from its arrival.

Between arrivals every ``SimCore`` advances to the next arrival time; its outputs
update the load tracker (first token, finish) and the per-request records, and its
cache events (stored / removed) are applied to the index before the next decision.

Simplifications (documented in docs/routing.md): one router; engine cache events
reach the index with no latency (they are applied at the next arrival, the first
moment the index is read). The whole run is one ``asyncio.run``; the stats jitter
is seeded; nothing depends on wall time or unseeded randomness, so it is
deterministic.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cache_service.index import IndexSettings
from cache_service.memory_index import MemoryPrefixIndex
from deploy.config import IndexConfig, KvrouteConfig, ModelConfig
from deploy.config.routing import PipelineConfig, PluginRef, profile
from ops.sim.trace import TraceRequest
from router.routing.admission import HoldQueue, own_prefill_s
from router.routing.context import Candidate, RequestContext
from router.routing.decision import Decider
from router.routing.load import LoadTracker, Ticket
from router.routing.plugins import PLUGINS
from router.routing.selection import RouteRequest, request_context
from router.routing.views import ReplicaInfo
from workers.engines.sim.core import SimCore, SimFinish, SimOutput, SimParams, SimRequest
from workers.protocol import SamplingParams


@dataclass(frozen=True, slots=True)
class SimConfig:
    replicas: int = 8
    speedup: float = 1.0
    kv_blocks: int = 1000  # C, per replica
    host_kv_blocks: int = 0  # C2, per replica: the host tier (0: none)
    host_reload_tok_s: float = 120000.0  # R: host -> device reload rate
    block_size: int = 512
    prefill_tok_s: float = 12000.0  # P, the emulated engines' real rate
    tpot_s: float = 0.020
    tpot_per_batch_s: float = 0.0002
    policy: str = "kvroute"
    seed: int = 0  # seeds random pickers (power of two and its fallbacks)
    prior_prefill_tok_s: float = 4000.0  # the router's prior (production default)
    tree_blocks: int | None = None  # baselines' tree cap; None: each plugin's default
    model: str = "sim"
    # Routing stats as Serve delivers them: taken every period (x U(0.9, 1.1), Serve's
    # jitter), seen by the router one controller tick later. Period 0: fresh at every
    # decision. 1 s is deploy/serve/builder.py's request_routing_stats_period_s.
    stats_period_s: float = 1.0
    stats_delay_s: float = 0.1


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    replica: str
    arrival_s: float
    prompt_tokens: int
    predicted_cached: int
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # of cached_tokens, reloaded from the host tier
    completion_tokens: int = 0


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    records: list[RequestRecord]
    replicas: list[str]
    prefill_busy_s: dict[str, float]  # per replica: seconds spent prefilling


@dataclass(slots=True)
class _Replica:
    """An emulated replica and the routing stats the router has of it."""

    name: str
    core: SimCore
    rng: random.Random  # the stats period's jitter
    next_report: float = 0.0
    in_transit: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)
    seen: dict[str, float] = field(default_factory=dict)  # as the router has it

    def report(self, t: float, cfg: SimConfig) -> None:
        """The worker's record_routing_stats at ``t``; the next one a jittered period on."""
        self.in_transit.append((t + cfg.stats_delay_s, self.core.load(t).routing_stats()))
        self.next_report = t + cfg.stats_period_s * self.rng.uniform(0.9, 1.1)

    def deliver(self, t: float) -> None:
        while self.in_transit and self.in_transit[0][0] <= t:
            self.seen = self.in_transit.popleft()[1]


def pipeline_config(cfg: SimConfig) -> PipelineConfig:
    """The named profile, with ``seed`` (and ``max_blocks``, if ``tree_blocks`` is set)
    applied to every plugin whose params have that field."""
    base = profile(cfg.policy)
    overrides: dict[str, Any] = {"seed": cfg.seed}
    if cfg.tree_blocks is not None:
        overrides["max_blocks"] = cfg.tree_blocks

    def fix(ref: PluginRef) -> PluginRef:
        fields = PLUGINS[ref.name].Params.model_fields
        extra = {k: v for k, v in overrides.items() if k in fields and k not in ref.params}
        return ref.model_copy(update={"params": {**ref.params, **extra}}) if extra else ref

    return PipelineConfig(
        filters=[fix(r) for r in base.filters],
        scorers=[fix(r) for r in base.scorers],
        picker=fix(base.picker),
        admission=base.admission,
    )


class Simulator:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.now = 0.0
        params = SimParams(
            kv_blocks=cfg.kv_blocks, block_size=cfg.block_size, prefill_tok_s=cfg.prefill_tok_s,
            tpot_s=cfg.tpot_s, tpot_per_batch_s=cfg.tpot_per_batch_s,
            host_kv_blocks=cfg.host_kv_blocks, host_reload_tok_s=cfg.host_reload_tok_s,
        )
        self.replicas = [
            _Replica(f"r{i}", SimCore(params, cfg.model, f"r{i}"), random.Random(cfg.seed + i))
            for i in range(cfg.replicas)
        ]
        for rep in self.replicas:  # Serve's stats calls start whenever each replica did
            rep.next_report = rep.rng.uniform(0.0, cfg.stats_period_s)
        self._by_name = {r.name: r for r in self.replicas}
        self.index = MemoryPrefixIndex(IndexSettings(), clock=lambda: self.now)
        routing = pipeline_config(cfg)
        self.loads = LoadTracker()
        self.decider = Decider(routing, self.loads, cfg.block_size, cfg.prior_prefill_tok_s)
        self._config = KvrouteConfig(  # what request_context reads: the model, the blocks
            models=[ModelConfig(name=cfg.model, engine="sim", model_path=cfg.model,
                                context_window=1 << 30)],
            index=IndexConfig(block_size=cfg.block_size))
        self.records: dict[str, RequestRecord] = {}
        self._tickets: dict[str, Ticket] = {}
        self.admission = routing.admission
        self._held: HoldQueue[tuple[str, TraceRequest, float]] = HoldQueue(
            self.admission.aging if self.admission else 0.0)

    async def run(self, trace: Sequence[TraceRequest]) -> SimResult:
        t0 = trace[0].arrival_s if trace else 0.0
        for i, req in enumerate(trace):
            arrival = (req.arrival_s - t0) / self.cfg.speedup
            await self._wait_held(arrival)
            await self._advance(arrival)
            await self._arrive(f"req-{i}", req)
        await self._wait_held(math.inf)
        for rep in self.replicas:  # run every replica dry
            self._absorb(rep.core.advance(math.inf))
        return SimResult(
            self.cfg, list(self.records.values()), [r.name for r in self.replicas],
            {r.name: r.core.load().prefill_busy_s for r in self.replicas},
        )

    async def _advance(self, t: float) -> None:
        self.now = t
        for rep in self.replicas:
            while self.cfg.stats_period_s > 0 and rep.next_report <= t:
                self._absorb(rep.core.advance(rep.next_report))
                rep.report(rep.next_report, self.cfg)
            self._absorb(rep.core.advance(t))
            rep.deliver(t)
            if events := rep.core.drain_events():
                await self.index.apply_events(events)

    async def _arrive(self, rid: str, req: TraceRequest) -> None:
        """Route at once, or hold at the router (the profile's admission, as production)."""
        ctx = await self._context(rid, req)
        if not self.decider.must_wait(ctx.candidates, len(self._held) > 0):
            return await self._route(rid, req, self.now, ctx)  # the common case: at once
        self._held.push(own_prefill_s(ctx), self.now, (rid, req, self.now))
        await self._release()

    async def _wait_held(self, until: float) -> None:
        """Advance tick by tick while requests are held (production also re-checks at
        every first token, so held requests wait up to one tick longer here)."""
        tick = self.admission.tick_s if self.admission else math.inf
        while len(self._held) and self.now + tick < until:
            await self._advance(self.now + tick)
            await self._release()

    async def _release(self) -> None:
        assert self.admission is not None
        while len(self._held):
            rid, req, arrival = self._held.peek()
            expired = self.now - arrival >= self.admission.max_hold_s
            if not expired and self.decider.must_wait(self._candidates({}), False):
                return
            self._held.pop()
            await self._route(rid, req, arrival)

    def _candidates(self, matches: dict[str, int]) -> list[Candidate]:
        view = [ReplicaInfo(rep.name, 1 << 30, self._reported(rep)) for rep in self.replicas]
        return self.decider.candidates(self.cfg.model, view, matches, self.now)

    async def _context(self, rid: str, req: TraceRequest) -> RequestContext:
        model, hashes = self.cfg.model, list(req.hash_ids)
        matches = (await self.index.lookup({model: hashes})).get(model, {})
        route = RouteRequest(model, [], SamplingParams(max_tokens=max(1, req.output_length)),
                             rid, {}, None)
        return request_context(self._config, route, {model: 1.0}, {model: hashes},
                               self._candidates(matches), None,
                               prompt_tokens=req.input_length, now=self.now)

    async def _route(self, rid: str, req: TraceRequest, arrival: float,
                     ctx: RequestContext | None = None) -> None:
        model, hashes, prompt = self.cfg.model, list(req.hash_ids), req.input_length
        ctx = ctx or await self._context(rid, req)
        target = self.decider.rank(ctx)[0]
        self._tickets[rid] = self.decider.begin(ctx, target, self.now)
        await self.index.record_routed(model, target.replica, hashes)
        # Predicted as the engine counts: at least one prompt token is always computed.
        predicted = min(target.matched_tokens, prompt - 1)
        self.records[rid] = RequestRecord(rid, target.replica, arrival, prompt, predicted)
        spec = SimRequest(rid, hashes, prompt, max(1, req.output_length))
        self._by_name[target.replica].core.submit(spec, self.now)

    def _reported(self, rep: _Replica) -> dict[str, float]:
        return rep.seen if self.cfg.stats_period_s > 0 else rep.core.load(self.now).routing_stats()

    def _absorb(self, outs: list[SimOutput]) -> None:
        for out in outs:
            rec = self.records[out.request_id]
            if isinstance(out, SimFinish):
                rec.finish_s, rec.cached_tokens = out.time, out.cached_tokens
                rec.host_cached_tokens = out.host_cached_tokens
                rec.completion_tokens = out.completion_tokens
                self.loads.end(self._tickets.pop(out.request_id), out.time)
            elif out.index == 0:  # first token: prefill just ended
                rec.first_token_s = out.time
                self.loads.first_token(self._tickets[out.request_id])


def simulate(trace: Sequence[TraceRequest], cfg: SimConfig) -> SimResult:
    """Run the whole simulation (one private event loop; deterministic)."""
    return asyncio.run(Simulator(cfg).run(trace))
