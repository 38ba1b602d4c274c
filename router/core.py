"""Route one tokenized request: index lookup → pipeline → dispatch (``router.dispatch.dispatch``).

``RouterCore`` is API-agnostic: the OpenAI and Anthropic front ends both hand it
token ids and get back a ``Generation`` that already holds the first message
from the chosen replica (so headers can name it, and a replica that fails before
its first token is retried on the next candidate, by the ``Dispatcher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from ray.serve.handle import DeploymentHandle

from cache_service import index_from_config
from cache_service.hashing import block_hashes, model_salt, tenant_salt
from cache_service.index import PrefixIndex
from deploy.config import KvrouteConfig, ModelConfig
from router import metrics, telemetry
from router.auth.keys import ApiKeyConfig, Authenticator
from router.auth.ratelimit import RateLimiter, store_url
from router.dispatch.dispatch import Dispatcher, Started
from router.dispatch.generation import Generation
from router.dispatch.loopback_stream import Loopback
from router.errors import ApiError
from router.prompt.setup import with_redis
from router.prompt.tokenizer import ChatTokenizer
from router.routing.admission import AdmissionGate, own_prefill_s
from router.routing.context import Candidate, RequestContext
from router.routing.decision import Decider
from router.routing.leases import SessionGaps, session_kind
from router.routing.load import LoadTracker
from router.routing.prewarm import Prewarmer, serve_sender
from router.routing.selection import (
    RouteRequest,
    check_shared_tokenizers,
    fingerprint,
    request_context,
)
from router.routing.views import replica_view
from workers.protocol import Final, SamplingParams, Usage, WorkerMessage, WorkRequest

log = logging.getLogger(__name__)
_VIEW_WAIT_S = 10.0


class RouterCore:
    def __init__(self, config: KvrouteConfig, handles: Mapping[str, DeploymentHandle],
                 loopback: Loopback | None = None) -> None:
        self.config = config
        self.models: dict[str, ModelConfig] = {m.name: m for m in config.models}
        cache = with_redis(config.router.prompt_cache, config.index)
        self.tokenizers = {m.name: ChatTokenizer(m.model_path, cache) for m in config.models}
        check_shared_tokenizers(config, self.tokenizers)
        self._salts = {m.name: model_salt(m.name) for m in config.models}
        by_ref = config.router.worker_transport == "actor"  # False: Serve's gRPC data plane
        streaming = {name: h.options(stream=True, _by_reference=by_ref)
                     for name, h in handles.items()}
        idx = config.index
        self.index: PrefixIndex = index_from_config(
            idx, on_error=lambda op: metrics.INDEX_ERRORS.labels(op).inc())
        routing = config.router.routing()
        self.loads = LoadTracker()
        self.decider = Decider(routing, self.loads, idx.block_size,
                               config.router.prefill_tokens_per_s)
        admission = routing.admission
        self.gate = AdmissionGate(admission, metrics.ADMISSION_WAIT.observe) \
            if admission is not None else None
        self.auth = Authenticator.from_config(config.auth)
        self.auth.on_caller = functools.partial(
            telemetry.identify, names_in_metrics=config.auth.key_names_in_metrics)
        self.isolation = idx.tenant_isolation
        self.predicted_header = idx.predicted_cached_header if \
            idx.predicted_cached_header is not None else (self.isolation or not self.auth.enabled)
        self.limiter = RateLimiter.from_url(
            store_url(config.auth.rate_limit_store, idx.redis_url) if self.auth.enabled
            else None, idx.namespace, timeout_s=idx.timeout_s,
            on_error=lambda op: metrics.INDEX_ERRORS.labels(op).inc(),
        )
        self.max_resumes = config.router.max_resumes
        self.gaps = SessionGaps(config.router.leases)
        self.dispatcher = Dispatcher(
            streaming, self.decider, config.router.max_retries,
            config.router.first_token_timeout_s, self._record_routed, self.remember, loopback,
            assign_timeout_s=config.router.assign_timeout_s, call_models=_call_models(config))
        # prefill-only requests to one replica: pre-warm, and lease renewals
        self._send_to = serve_sender(streaming, self.on_final, self._record_routed)
        self.prewarm = Prewarmer(config.router.prewarm, idx.block_size, self._send_to,
                                 idx.redis_url, idx.namespace, timeout_s=idx.timeout_s)
        self._known: dict[str, set[str]] = {}
        self._ticks = 0
        self.router_id = ""  # this router replica, for the x-kvroute-router header
        # The decision's clocks (kvroute sim and its tests give virtual ones): wall-clock
        # time for worker reports, monotonic time for plugins' own state.
        self.clock, self.monotonic = time.time, time.monotonic
        self._tasks: set[asyncio.Task[Any]] = set()

    def resolve(self, name: str) -> dict[str, float]:
        """A model, group or 'auto' -> {model: preference}; 404 if unknown."""
        weights = self.config.resolve(name)
        if weights is None:
            raise ApiError(404, f"model {name!r} does not exist", "model_not_found", "model")
        if name == "auto" and len(weights) > 1:  # only models that share one tokenization
            first = fingerprint(self.tokenizers[next(iter(weights))])
            weights = {m: w for m, w in weights.items()
                       if fingerprint(self.tokenizers[m]) == first}
        return weights

    def primary(self, name: str) -> ModelConfig:
        """The model config behind a name (a group's first member)."""
        return self.models[next(iter(self.resolve(name)))]

    def tokenizer(self, name: str) -> ChatTokenizer:
        """The tokenizer of a model, or of a group (whose members share one)."""
        return self.tokenizers[next(iter(self.resolve(name)))]

    def replica_stats(self) -> dict[str, list[dict[str, Any]]]:
        """Each replica's own report, plus ``router_ongoing``: the requests this router
        replica has on it now (its load view: tickets begun and not yet ended)."""
        return {
            name: [{"replica": i.replica, "max_ongoing_requests": i.max_ongoing_requests,
                    **i.stats, "router_ongoing": self.loads.get(name, i.replica).ongoing}
                   for i in replica_view(name)]
            for name in self.models
        }

    def ready(self) -> dict[str, int]:
        return {name: len(replica_view(name)) for name in self.models}

    def refund(self, key: ApiKeyConfig, tokens: int) -> None:
        if tokens > 0:
            self._spawn(self.limiter.refund(key, tokens))

    async def generate(
        self, model: str, token_ids: list[int], sampling: SamplingParams, request_id: str,
        headers: Mapping[str, str] | None = None, session_id: str | None = None,
        api_key: ApiKeyConfig | None = None, has_tools: bool = False,
    ) -> Generation:
        """Admit (rate limits: prompt + max_tokens; ``api_key`` comes from
        ``http_util.admit_caller``, which charged the request itself), then route and
        dispatch.

        ``model`` may name a model, a group or 'auto': (model, replica) pairs of every
        member are scored together.
        """
        tenant = api_key.name if self.isolation and api_key is not None else None
        req = RouteRequest(model, token_ids, sampling, request_id, headers or {}, session_id,
                           has_tools, tenant)
        if api_key is None:
            return await self._generate(req)
        charged = len(token_ids) + sampling.max_tokens
        await self.limiter.admit(api_key, charged, request=False)  # counted by admit_caller
        try:
            gen = await self._generate(req)
        except asyncio.CancelledError:  # the client left: its prompt stays charged
            self.refund(api_key, sampling.max_tokens)
            raise
        except BaseException:
            self.refund(api_key, charged)  # nothing was generated
            raise
        gen.api_key, gen.max_tokens = api_key, sampling.max_tokens
        return gen

    async def _generate(self, req: RouteRequest) -> Generation:
        info = telemetry.current()
        weights = self.resolve(req.name)
        # A configured model, never the client's string (aliases match patterns): metric
        # labels stay bounded by the config.
        info.model = req.name if req.name in weights else next(iter(weights))
        started = time.perf_counter()
        hashes = self._hashes(req.token_ids, weights, req.tenant)
        ctx = await self._context(req, weights, hashes)
        if self.gate is not None and await self._admit(ctx, weights):
            started = time.perf_counter()
            ctx = await self._context(req, weights, hashes)  # the view after the wait
        ranked = self._rank(ctx)
        metrics.ROUTE.observe(time.perf_counter() - started)
        lease_s = self.gaps.turn(req.session_id, self.monotonic())
        work = WorkRequest(req.request_id, req.token_ids, req.sampling, cache_salt=req.tenant,
                           lease_s=lease_s)
        run = await self.dispatcher.dispatch(ranked, ctx, work, info)
        gen = self._generation(run, req, info)
        gen.request = dataclasses.replace(req, name=gen.model)  # what a resume starts from
        info.model, info.replica = gen.model, gen.replica
        if req.session_id:
            self._spawn(self.index.record_session(req.session_id, gen.model, gen.replica))
            if lease_s > 0 and self.gaps.config.by_ending:
                info.on_end = functools.partial(self._turn_ended, gen, lease_s)
        return gen

    def _turn_ended(self, gen: Generation, sent_lease_s: float,
                    info: telemetry.RequestInfo) -> None:
        """A session's turn ended (its whole reply went out): a final answer's pause is
        longer than the tool pause its request was leased for, so renew the lease on its
        replica with a prefill-only request of prompt + reply (``router.routing.leases``)."""
        req = gen.request
        if gen.final is None or req is None or not req.session_id:
            return
        lease_s = self.gaps.ended(req.session_id, self.monotonic(), info.tool_calls > 0)
        if lease_s <= sent_lease_s:
            return
        work = WorkRequest(f"{req.request_id}-lease", req.token_ids + gen.sent,
                           SamplingParams(max_tokens=1), cache_salt=req.tenant, lease_s=lease_s,
                           background=True)
        self._spawn(self._renew(gen.model, gen.replica, work))

    async def _renew(self, model: str, replica: str, work: WorkRequest) -> None:
        try:
            if await self._send_to(model, replica, work, ()):
                metrics.LEASE_RENEWALS.labels(model).inc()
        except Exception as e:  # a lost renewal costs at most a hit
            log.debug("lease renewal on %s failed: %r", replica, e)

    def _generation(self, run: Started, req: RouteRequest,
                    info: telemetry.RequestInfo) -> Generation:
        return Generation(run.model, run.target.replica, self.router_id,
                          run.target.matched_tokens, len(req.token_ids), run.first, run, self,
                          info)

    def _hashes(self, token_ids: list[int], models: Mapping[str, float],
                tenant: str | None = None) -> dict[str, list[int]]:
        """Each model's block hashes, salted by the model and (isolation on) the tenant."""
        bs = self.config.index.block_size
        return {m: block_hashes(token_ids, bs, tenant_salt(self._salts[m], tenant))
                for m in models}

    def _rank(self, ctx: RequestContext, skip: str | None = None) -> list[Candidate]:
        """The decider's ranking (without replica ``skip``); the best is marked routed."""
        with telemetry.TRACER.start_as_current_span("route"):
            return self.decider.rank(ctx, skip)

    async def _context(self, req: RouteRequest, weights: Mapping[str, float],
                       hashes: dict[str, list[int]]) -> RequestContext:
        started = time.perf_counter()
        with telemetry.TRACER.start_as_current_span("index.lookup") as span:
            # one round trip for every candidate model; the session's read runs alongside
            match, sticky = await asyncio.gather(self.index.lookup(hashes),
                                                 self._sticky(req.session_id))
            span.set_attribute("kvroute.blocks", len(next(iter(hashes.values()))))
        metrics.LOOKUP.observe(time.perf_counter() - started)
        for m in weights:  # what pre-warm sends new replicas (router.routing.prewarm)
            self.prewarm.observe(m, req.tenant, req.token_ids, hashes[m], match.get(m, {}))
        cands = await self._all_candidates(weights, match)
        return request_context(self.config, req, weights, hashes, cands, sticky,
                               prompt_tokens=len(req.token_ids), now=self.monotonic())

    async def _admit(self, ctx: RequestContext, weights: Mapping[str, float]) -> bool:
        """Wait at the router while every candidate is backed up; True if it waited."""
        assert self.gate is not None
        models = tuple(weights)
        if not self.decider.must_wait(ctx.candidates, self.gate.holding(models)):
            return False  # the common case, decided on the candidates already built

        def ready() -> bool:
            cands = [c for m in weights for c in self._candidates(m, {})]
            return not self.decider.must_wait(cands, False)

        with telemetry.TRACER.start_as_current_span("admission") as span:
            metrics.ADMISSION_HELD.set(self.gate.held + 1)
            try:
                waited = await self.gate.admit(models, own_prefill_s(ctx), ready)
            finally:
                metrics.ADMISSION_HELD.set(self.gate.held)
            span.set_attribute("kvroute.admission_wait_s", waited)
        return waited > 0

    def on_first_token(self) -> None:
        if self.gate is not None:
            self.gate.poke()  # a replica's backlog just fell: held requests may go

    async def _sticky(self, session_id: str | None) -> tuple[str, str] | None:
        return await self.index.session(session_id) if session_id else None

    async def resume(self, gen: Generation, err: Exception) -> WorkerMessage:
        """Route the rest of a cut stream: prompt + sent tokens, on the same model, never
        the replica that failed; returns the first message of the continuation."""
        assert gen.request is not None
        left = gen.request.sampling.max_tokens - len(gen.sent)
        if left <= 0:  # cut between the last token and the final message
            return Final(gen.replica, Usage(gen.prompt_tokens, len(gen.sent) - gen.carried, 0),
                         "length")
        sampling = dataclasses.replace(gen.request.sampling, max_tokens=left)
        ids = gen.request.token_ids + gen.sent
        req = dataclasses.replace(gen.request, token_ids=ids, sampling=sampling,
                                  request_id=f"{gen.request.request_id}-r{gen.resumes}")
        weights = {gen.model: 1.0}
        ctx = await self._context(req, weights, self._hashes(ids, weights, req.tenant))
        ranked = self._rank(ctx, skip=gen.replica)
        if not ranked:
            raise err
        metrics.RESUMES.labels(gen.model).inc()
        lease_s = self.gaps.start_lease(session_kind(req.session_id)) if req.session_id \
            else 0.0
        work = WorkRequest(req.request_id, ids, sampling, cache_salt=req.tenant, lease_s=lease_s)
        return gen.adopt(await self.dispatcher.dispatch(ranked, ctx, work, gen._info))

    async def _all_candidates(
        self, weights: Mapping[str, float], match: Mapping[str, Mapping[str, int]]
    ) -> list[Candidate]:
        cands = [c for m in weights for c in self._candidates(m, match.get(m, {}))]
        deadline = asyncio.get_running_loop().time() + _VIEW_WAIT_S
        while not cands and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)  # replicas starting, or this handle just initialised
            cands = [c for m in weights for c in self._candidates(m, match.get(m, {}))]
        if not cands:
            names = ", ".join(weights)
            raise ApiError(503, f"no ready replica of {names}", "no_replica", None, 5)
        return cands

    def _candidates(self, model: str, matches: Mapping[str, int]) -> list[Candidate]:
        view = self.prewarm.admit(model, replica_view(model))  # none being warmed
        return self.decider.candidates(model, view, matches, self.clock())

    def on_final(self, model: str, final: Final) -> None:
        if final.events:  # the embedded index: the replica's cache events ride back here
            self._spawn(self.index.apply_events(list(final.events)))

    def _record_routed(self, model: str, replica: str, hashes: list[int]) -> None:
        self._spawn(self.index.record_routed(model, replica, hashes))

    def remember(self, model: str, replica: str) -> None:
        """Known replicas are purged from the index once Serve's view drops them; one
        routed to and dead before the next maintenance tick must be known too."""
        self._known.setdefault(model, set()).add(replica)

    async def maintain(self) -> None:
        """Purge replicas Serve removed; forget their load. Runs every second."""
        live: set[tuple[str, str]] = set()
        for model in self.models:
            view = replica_view(model)
            self.prewarm.admit(model, view)  # warm-ups start on a quiet router too
            for info in view:
                metrics.ONGOING.labels(model, info.replica).set(
                    info.stats.get("ongoing_requests", 0))
                metrics.QUEUED.labels(model, info.replica).set(
                    info.stats.get("queued_prefill_tokens", 0))
            now = {info.replica for info in view}
            for gone in sorted(self._known.get(model, set()) - now):
                await self.index.remove_replica(model, gone)
                with contextlib.suppress(KeyError):
                    metrics.ONGOING.remove(model, gone)
                    metrics.QUEUED.remove(model, gone)
            self._known[model] = now
            live |= {(model, r) for r in now}
        self.loads.forget(live)
        self.dispatcher.forget({r for _, r in live})
        self._ticks += 1
        if self._ticks % 5 == 0:  # index stats cost a Redis call: every 5 s is plenty
            # replicas whose heartbeats stopped (a node lost while no router watched it)
            await self.index.purge_dead()
            stats = await self.index.stats()
            metrics.INDEX_BLOCKS.set(stats.blocks)
            metrics.INDEX_REPLICAS.set(stats.replicas)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self.gate is not None:
            await self.gate.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self.index.close()
        await self.prewarm.close()
        await self.limiter.close()


def _call_models(config: KvrouteConfig) -> frozenset[str]:
    """Models whose requests may start as loopback calls (``router.start_transport``):
    not those Serve autoscales on its own ongoing-request counts, which miss them."""
    if config.router.start_transport != "loopback":
        return frozenset()
    return frozenset(m.name for m in config.models if m.autoscaling is None
                     or m.autoscaling.policy != "serve-default")

