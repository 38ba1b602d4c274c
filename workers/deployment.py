"""The worker deployment: one Serve deployment per model, one engine per replica.

A thin shim over ``workers.protocol.Engine``. The router calls ``generate`` with a
``WorkRequest`` and a ranked replica hint (read by ``router.dispatch.request_router``); the
stream yields ``WorkerMessage``s: ``Chunk``s, then one ``Final`` with usage measured
by the engine (and, with the memory index, the replica's cache events), or a
``Rejected`` first message for input the engine refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

import ray
from ray import serve

from cache_service import index_from_config
from deploy.config import IndexConfig, ModelConfig
from deploy.tracing import setup_tracing, shutdown_tracing
from workers.engines import make_engine
from workers.protocol import (
    AutoscalingStats,
    BackgroundWork,
    Chunk,
    EngineError,
    Final,
    Finished,
    GenerateRequest,
    Handoff,
    Rejected,
    TokenChunk,
    WorkerMessage,
    WorkRequest,
)
from workers.publisher import IndexPublisher
from workers.spans import GenerationSpans
from workers.transport.loopback import LoopbackServer
from workers.transport.stream_pacing import paced

log = logging.getLogger(__name__)


class DirectEndpoint(Protocol):
    """A replica's own HTTP endpoint (``router.app.replica_endpoint.DirectHttp``, benchmark
    only).

    The builder hands its class to the worker, so ``workers`` never imports ``router``."""

    address: str | None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


DirectFactory = Callable[[str, str, Callable[[WorkRequest], AsyncIterator[WorkerMessage]],
                          str | None], DirectEndpoint]


DRAIN_S = 20.0  # how long a stopping replica lets its loopback calls finish


class LoopbackCalls:
    """This replica's loopback calls (``workers.transport.loopback_call.CallTarget``): they and
    Serve's calls share ``max_ongoing_requests``; none is taken once it is stopping."""

    def __init__(self, worker: ModelWorker, replica: str, limit: int) -> None:
        self._worker, self.replica, self._limit = worker, replica, limit
        self.open = 0
        self.total = 0
        self.stopping = False
        self._idle = asyncio.Event()
        self._idle.set()

    def admit(self) -> bool:
        if self.stopping or self.open + self._worker._serve_calls >= self._limit:
            return False
        self.open += 1
        self.total += 1
        self._idle.clear()
        return True

    def release(self) -> None:
        self.open -= 1
        if not self.open:
            self._idle.set()

    def run(self, work: WorkRequest) -> AsyncIterator[WorkerMessage]:
        return self._worker._run(work)  # type: ignore[return-value]  # no loopback_node

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls; wait up to ``timeout_s`` for the open ones to end."""
        self.stopping = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)


class ModelWorker:
    async def __init__(self, model: dict[str, Any], index: dict[str, Any],
                       direct_http: DirectFactory | None = None,
                       direct_token: str | None = None,
                       stream_token: str | None = None) -> None:
        setup_tracing("kvroute-worker")
        self._cfg = ModelConfig.model_validate(model)
        idx = IndexConfig.model_validate(index).resolved()  # redis_url_env: this process's env
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._node = ray.get_runtime_context().get_node_id()
        self._engine = make_engine(self._cfg, self._replica, idx.block_size)
        self._ids = itertools.count()  # engine request ids (_engine_id)
        self._started = 0  # requests begun, for the autoscaler's work per request
        self._background = BackgroundWork()  # the router's own requests: not demand
        self._handoffs = 0  # streams sent over the loopback socket (reported in load())
        await self._engine.start()
        self._publisher: IndexPublisher | None = None
        if idx.redis_url:
            index = index_from_config(idx)
            self._publisher = IndexPublisher(self._engine, index, self._cfg.name, self._replica,
                                             idx.publish_flush_s, idx.heartbeat_s)
            self._publisher.start()
        self._loopback: LoopbackServer | None = None
        self._serve_calls = 0  # generate() calls running (Serve's handle)
        self._calls = LoopbackCalls(self, self._replica, self._cfg.max_ongoing_requests)
        if stream_token is not None:  # router.stream_transport: loopback
            self._loopback = LoopbackServer(stream_token, calls=self._calls)
            await self._loopback.start()
        self._direct: DirectEndpoint | None = None
        if direct_http is not None:
            self._direct = direct_http(self._cfg.name, self._cfg.model_path, self.generate,
                                       direct_token)  # the builder's per-deployment token
            await self._direct.start()
        log.info("worker %s/%s ready (%s)", self._cfg.name, self._replica, self._cfg.engine)

    async def generate(
        self, request: WorkRequest, kvroute_rank: list[str] | None = None
    ) -> AsyncIterator[WorkerMessage | Handoff]:
        """Stream one generation. ``kvroute_rank`` is consumed by the request router."""
        self._serve_calls += 1
        try:
            async for msg in self._run(request):
                yield msg
        finally:
            self._serve_calls -= 1

    async def _run(self, request: WorkRequest) -> AsyncIterator[WorkerMessage | Handoff]:
        """One generation, however it came (Serve's handle, or a loopback call)."""
        req = GenerateRequest(self._engine_id(request.request_id), request.token_ids,
                              request.sampling, request.cache_salt, request.lease_s)
        if request.background:
            self._background.begin(len(req.token_ids))
        else:
            self._started += 1
        spans = GenerationSpans(request.trace, {
            "gen_ai.request.model": self._cfg.name, "kvroute.replica": self._replica,
            "gen_ai.usage.input_tokens": len(req.token_ids),
        })
        final: Final | None = None
        items = paced(self._guarded(req), self._cfg.stream_interval_ms / 1000)
        relay: AsyncGenerator[Handoff | Final, None] | None = None
        loopback = self._loopback if request.loopback_node == self._node else None
        try:
            async for item in items:
                spans.first_token()
                if isinstance(item, TokenChunk) and loopback is not None:
                    relay = self._relay(loopback, item, items)
                    async for msg in relay:
                        final = msg if isinstance(msg, Final) else None
                        yield msg
                    break
                if isinstance(item, Finished):
                    final = self._final(item)
                    yield final
                elif isinstance(item, TokenChunk):
                    yield Chunk(self._replica, item.text, item.token_ids, item.logprobs,
                                item.prompt_logprobs)
                else:
                    yield item
        finally:
            if relay is not None:
                await relay.aclose()  # its slot goes, its socket closes
            await items.aclose()  # the client left (Serve's cancel): the engine aborts
            spans.finish(final.usage if final else None, error=final is None)
            if request.background:  # finished or cancelled: its work is out either way
                self._background.end(len(req.token_ids))

    async def _relay(self, loopback: LoopbackServer, first: TokenChunk,
                     items: AsyncIterator[TokenChunk | Finished | Rejected]
                     ) -> AsyncIterator[Handoff | Final]:
        """The first chunk as a ``Handoff``, the next ones over the router's loopback
        connection (``workers.transport.loopback``), then the ``Final`` here on the Serve stream."""
        key = loopback.open()
        self._handoffs += 1
        try:
            yield Handoff(self._replica, Chunk(self._replica, first.text, first.token_ids,
                                               first.logprobs, first.prompt_logprobs),
                          loopback.address or "", key)
            writer = await loopback.claim(key)
        finally:
            loopback.drop(key)
        last = await loopback.pump(writer, items)
        if not isinstance(last, Finished):  # None: the engine ended without finishing
            raise EngineError(f"stream of {self._replica} ended without a final message")
        yield self._final(last)

    def _engine_id(self, request_id: str) -> str:
        """The router's id (the client's ``x-request-id`` when it sent one) made unique on
        this engine: clients reuse ids, and an engine refuses an id that is still running."""
        return f"{request_id}#{next(self._ids)}"

    async def _guarded(self, req: GenerateRequest) -> AsyncGenerator[
            TokenChunk | Finished | Rejected, None]:
        """The engine's stream; input it refuses becomes a ``Rejected``, not a crash."""
        try:
            async for item in self._engine.generate(req):
                yield item
        except ValueError as e:  # InputRejected, or a runtime's own input check
            yield Rejected(self._replica, str(e))

    def _final(self, item: Finished) -> Final:
        events = () if self._publisher is not None else \
            tuple(self._engine.drain_cache_events())
        return Final(self._replica, item.usage, item.finish_reason, item.stop_sequence, events)

    async def load(self) -> dict[str, Any]:
        stats = self._engine.load()
        return {
            "replica": self._replica,
            "node": self._node,
            "http": self._direct.address if self._direct else None,
            "kv_events": self._engine.kv_events_endpoint,
            "loopback_streams": self._handoffs,
            "loopback_calls": self._calls.total,
            **stats.routing_stats(),
        }

    async def record_routing_stats(self) -> dict[str, Any]:
        return await self.load()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics (read by ``deploy.autoscale.policy``)."""
        return AutoscalingStats.from_load(self._engine.load(), self._started,
                                          self._background).to_serve()

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def __del__(self) -> None:
        await self._calls.drain(DRAIN_S)  # Serve drained its own calls before this
        if self._loopback is not None:
            await self._loopback.stop()
        if self._direct is not None:
            await self._direct.stop()
        if self._publisher is not None:
            await self._publisher.stop()
        await self._engine.shutdown()
        shutdown_tracing()
