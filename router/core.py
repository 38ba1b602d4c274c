"""The hub: one request's coordination, from an admitted caller to a started generation.

``RouterCore`` is API-agnostic. The front ends (``router.api``) call its small surface:
``admit`` (key and requests/min, before the body), ``target`` (the model name resolved
once), ``generate`` (token ids → a ``Generation`` that already holds the first message
from the chosen replica, so headers can name it; a replica that fails before its first
token is retried on the next candidate by the ``Dispatcher``) and, through the
generation, ``resume``. The steps live in ``router.routing`` and ``router.dispatch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from ray.serve.handle import DeploymentHandle

from cache_service import index_from_config
from cache_service.hashing import model_salt
from cache_service.index import PrefixIndex
from deploy.config import KvrouteConfig
from router import metrics, telemetry
from router.auth.bodies import BodyWaits
from router.auth.keys import ApiKeyConfig, Authenticator
from router.auth.ratelimit import RateLimiter, store_url
from router.dispatch.dispatch import Dispatcher
from router.dispatch.generation import Generation
from router.dispatch.loopback_stream import Loopback
from router.dispatch.renewal import LeaseRenewal
from router.prompt.setup import with_redis
from router.prompt.tokenizer import ChatTokenizer
from router.routing import lookup
from router.routing.admission import AdmissionGate
from router.routing.context import Candidate, RequestContext
from router.routing.decision import Decider
from router.routing.housekeeping import Housekeeping
from router.routing.leases import SessionGaps, session_kind
from router.routing.load import LoadTracker
from router.routing.prewarm import Prewarmer, serve_sender
from router.routing.selection import Pin, RouteRequest, check_shared_tokenizers, pinned
from router.routing.target import Target, Targets
from workers.protocol import Final, SamplingParams, Usage, WorkerMessage, WorkRequest


class RouterCore:
    def __init__(self, config: KvrouteConfig, handles: Mapping[str, DeploymentHandle],
                 loopback: Loopback | None = None) -> None:
        self.config, self.server = config, config.server
        cache = with_redis(config.router.prompt_cache, config.index, config.auth)
        self.tokenizers = {m.name: ChatTokenizer(m.model_path, cache) for m in config.models}
        check_shared_tokenizers(config, self.tokenizers)
        self.targets = Targets(config, self.tokenizers)
        self.salts = {m.name: model_salt(m.name) for m in config.models}
        by_ref = config.router.worker_transport == "actor"  # False: Serve's gRPC data plane
        streaming = {name: h.options(stream=True, _by_reference=by_ref)
                     for name, h in handles.items()}
        idx = config.index
        on_error = lambda op: metrics.INDEX_ERRORS.labels(op).inc()  # noqa: E731
        self.index: PrefixIndex = index_from_config(idx, on_error=on_error)
        routing = config.router.routing()
        self.loads = LoadTracker()
        self.decider = Decider(routing, self.loads, idx.block_size,
                               config.router.prefill_tokens_per_s)
        self.gate = AdmissionGate(routing.admission, metrics.ADMISSION_WAIT.observe) \
            if routing.admission is not None else None
        self.auth = Authenticator.from_config(config.auth)
        self.auth.on_caller = functools.partial(
            telemetry.identify, names_in_metrics=config.auth.key_names_in_metrics)
        self.isolation = idx.tenant_isolation
        self.predicted_header = idx.predicted_cached_header if \
            idx.predicted_cached_header is not None else (self.isolation or not self.auth.enabled)
        self.limiter = RateLimiter.from_url(
            store_url(config.auth.rate_limit_store, idx.redis_url) if self.auth.enabled
            else None, idx.namespace, timeout_s=idx.timeout_s, on_error=on_error)
        self.max_resumes, self.gaps = config.router.max_resumes, SessionGaps(config.router.leases)
        self.body_waits = BodyWaits(config.server.max_body_waits_per_key)  # per key, reading
        self.housekeeping = Housekeeping(self.tokenizers, lambda live: self.dispatcher.forget(live))
        self.dispatcher = Dispatcher(
            streaming, self.decider, config.router.max_retries, config.router.first_token_timeout_s,
            self._record_routed, self.housekeeping.remember, loopback,
            assign_timeout_s=config.router.assign_timeout_s, call_models=_call_models(config))
        # prefill-only requests to one replica: pre-warm, and lease renewals
        send = serve_sender(streaming, self.on_final, self._record_routed)
        self.prewarm = Prewarmer(config.router.prewarm, idx.block_size, send,
                                 idx.redis_url, idx.namespace, timeout_s=idx.timeout_s)
        self.renewal = LeaseRenewal(self.gaps, send, lambda: self.monotonic(), self._spawn)
        self.router_id = ""  # this router replica, for the x-kvroute-router header
        # The decision's clocks (kvroute sim and its tests give virtual ones): wall-clock
        # time for worker reports, monotonic time for plugins' own state.
        self.clock, self.monotonic = time.time, time.monotonic
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- what the front ends call ------------------------------------------------------
    async def admit(self, headers: Mapping[str, str]) -> ApiKeyConfig | None:
        """Authenticate (401) and charge one request to the key's requests/min (429) before
        the body is read, so a refused caller costs no parse. The key goes on to
        ``generate``, whose own admission then charges tokens only."""
        key = self.auth.authenticate(headers)
        if key is not None and key.requests_per_min:
            await self.limiter.admit(key, None)
        return key

    def target(self, name: str, key: ApiKeyConfig | None = None) -> Target:
        """A model, group or 'auto' resolved once (404 if unknown); ``key``'s prompt cache."""
        return self.targets.resolve(name, key.name if self.isolation and key else None)

    async def generate(
        self, target: Target, token_ids: list[int], sampling: SamplingParams, request_id: str,
        headers: Mapping[str, str] | None = None, session_id: str | None = None,
        api_key: ApiKeyConfig | None = None, has_tools: bool = False, pin: Pin = None,
    ) -> Generation:
        """Admit (rate limits: prompt + max_tokens), route (every member of ``target``'s
        pairs scored together; ``pin``'s first: ``selection.pinned``) and dispatch."""
        tenant = api_key.name if self.isolation and api_key is not None else None
        req = RouteRequest(target.name, token_ids, sampling, request_id, headers or {},
                           session_id, has_tools, tenant, pin)
        if api_key is None:
            return await self._generate(req, target)
        charged = len(token_ids) + sampling.max_tokens
        await self.limiter.admit(api_key, charged, request=False)  # counted by admit
        try:
            gen = await self._generate(req, target)
        except asyncio.CancelledError:  # the client left: its prompt stays charged
            self.refund(api_key, sampling.max_tokens)
            raise
        except BaseException:
            self.refund(api_key, charged)  # nothing was generated
            raise
        gen.api_key, gen.max_tokens = api_key, sampling.max_tokens
        return gen

    async def _generate(self, req: RouteRequest, target: Target) -> Generation:
        info, weights = telemetry.current(), target.weights
        info.model = target.label
        started = time.perf_counter()
        hashes = self._hashes(req.token_ids, weights, req.tenant)
        ctx = await self._context(req, weights, hashes)
        if self.gate is not None and await lookup.wait_if_backed_up(self, ctx, weights):
            started = time.perf_counter()
            ctx = await self._context(req, weights, hashes)  # the view after the wait
        ranked = pinned(self._rank(ctx), req.pin)
        metrics.ROUTE.observe(time.perf_counter() - started)
        lease_s = self.gaps.turn(req.session_id, self.monotonic())
        work = WorkRequest(req.request_id, req.token_ids, req.sampling, cache_salt=req.tenant,
                           lease_s=lease_s)
        run = await self.dispatcher.dispatch(ranked, ctx, work, info)
        gen = Generation(run.model, run.target.replica, self.router_id, run.target.matched_tokens,
                         len(req.token_ids), run.first, run, self, info)
        gen.request = dataclasses.replace(req, name=gen.model)  # what a resume starts from
        info.model, info.replica = gen.model, gen.replica
        if req.session_id:
            self._spawn(self.index.record_session(req.session_id, gen.model, gen.replica))
            if lease_s > 0 and self.gaps.config.by_ending:
                info.on_end = functools.partial(self.renewal.turn_ended, gen, lease_s)
        return gen

    # -- one decision (router.routing.lookup, the decider) ------------------------------
    def _hashes(self, token_ids: list[int], models: Mapping[str, float],
                tenant: str | None = None) -> dict[str, list[int]]:
        return lookup.hashes(self, token_ids, models, tenant)

    async def _context(self, req: RouteRequest, weights: Mapping[str, float],
                       hashes: dict[str, list[int]]) -> RequestContext:
        return await lookup.context(self, req, weights, hashes)

    def _rank(self, ctx: RequestContext, skip: str | None = None) -> list[Candidate]:
        """The decider's ranking (without replica ``skip``); the best is marked routed."""
        with telemetry.TRACER.start_as_current_span("route"):
            return self.decider.rank(ctx, skip)

    # -- StreamOwner: what a Generation reports to and resumes through ------------------
    async def resume(self, gen: Generation, err: Exception) -> WorkerMessage:
        """Route the rest of a cut stream: prompt + sent tokens, on the same model, never
        the replica that failed; returns the first message of the continuation."""
        assert gen.request is not None
        left = gen.request.sampling.max_tokens - len(gen.sent)
        if left <= 0:  # cut between the last token and the final message
            return Final(gen.replica, Usage(gen.prompt_tokens, len(gen.sent) - gen.carried, 0),
                         "length")
        sampling = dataclasses.replace(gen.request.sampling, max_tokens=left,
                                       prompt_logprobs=None)  # sent with the first chunk
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

    def on_first_token(self) -> None:
        if self.gate is not None:
            self.gate.poke()  # a replica's backlog just fell: held requests may go

    def on_final(self, model: str, final: Final) -> None:
        if final.events:  # the embedded index: the replica's cache events ride back here
            self._spawn(self.index.apply_events(list(final.events)))

    def refund(self, key: ApiKeyConfig, tokens: int) -> None:
        if tokens > 0:
            self._spawn(self.limiter.refund(key, tokens))

    # -- the dispatcher's callbacks, housekeeping and shutdown --------------------------
    def _record_routed(self, model: str, replica: str, hashes: list[int]) -> None:
        self._spawn(self.index.record_routed(model, replica, hashes))

    async def maintain(self) -> None:
        """The once-a-second tick (``router.routing.housekeeping``)."""
        await self.housekeeping.tick(self.index, self.prewarm, self.loads)

    def replica_stats(self) -> dict[str, list[dict[str, Any]]]:
        return self.housekeeping.replica_stats(self.loads)

    def ready(self) -> dict[str, int]:
        return self.housekeeping.ready()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
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
