"""The worker deployment: one Serve deployment per model, one engine per replica.

A thin shim over ``workers.protocol.Engine``. The router calls ``generate``
with token ids and a ranked replica hint (read by ``router.request_router``);
the stream yields wire dicts: text chunks, then one final message with usage
measured by the engine (and, with the memory index, the replica's cache events).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from cache_service import IndexSettings, make_index
from deploy.config import IndexConfig, ModelConfig
from ops.tracing import setup_tracing, shutdown_tracing
from workers.direct_http import DirectHttp
from workers.engines import make_engine
from workers.protocol import Finished, GenerateRequest, SamplingParams
from workers.publisher import IndexPublisher, to_wire
from workers.spans import GenerationSpans

log = logging.getLogger(__name__)
class ModelWorker:
    async def __init__(self, model: dict[str, Any], index: dict[str, Any]) -> None:
        setup_tracing("kvroute-worker")
        self._cfg = ModelConfig.model_validate(model)
        idx = IndexConfig.model_validate(index)
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._node = ray.get_runtime_context().get_node_id()
        self._engine = make_engine(self._cfg, self._replica, idx.block_size)
        self._ids = itertools.count()  # engine request ids (_engine_id)
        await self._engine.start()
        self._publisher: IndexPublisher | None = None
        if idx.redis_url:
            settings = IndexSettings(
                namespace=idx.namespace, routed_ttl_s=idx.routed_ttl_s,
                stored_ttl_s=idx.stored_ttl_s, liveness_ttl_s=idx.liveness_ttl_s,
            )
            index = make_index(idx.redis_url, settings)
            self._publisher = IndexPublisher(self._engine, index, self._cfg.name, self._replica)
            self._publisher.start()
        self._direct: DirectHttp | None = None
        if self._cfg.direct_http:
            self._direct = DirectHttp(self._cfg.name, self._cfg.model_path, self.generate)
            await self._direct.start()
        log.info("worker %s/%s ready (%s)", self._cfg.name, self._replica, self._cfg.engine)

    async def generate(
        self, request: dict[str, Any], kvroute_rank: list[str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream one generation. ``kvroute_rank`` is consumed by the request router."""
        req = GenerateRequest(
            request_id=self._engine_id(str(request["request_id"])),
            token_ids=[int(t) for t in request["token_ids"]],
            sampling=SamplingParams(**request.get("sampling", {})),
        )
        spans = GenerationSpans(request.get("trace"), {
            "gen_ai.request.model": self._cfg.name, "kvroute.replica": self._replica,
            "gen_ai.usage.input_tokens": len(req.token_ids),
        })
        final: dict[str, Any] | None = None
        try:
            async for item in self._guarded(req):
                spans.first_token()
                if isinstance(item, dict):
                    yield item
                elif isinstance(item, Finished):
                    final = self._final(item)
                    yield final
                else:
                    yield {"replica": self._replica, "text": item.text, "n": len(item.token_ids),
                           "ids": list(item.token_ids)}  # what the router resumes from
        finally:
            spans.finish(final["usage"] if final else None, error=final is None)

    def _engine_id(self, request_id: str) -> str:
        """The router's id (the client's ``x-request-id`` when it sent one) made unique on
        this engine: clients reuse ids, and an engine refuses an id that is still running."""
        return f"{request_id}#{next(self._ids)}"

    async def _guarded(self, req: GenerateRequest) -> AsyncIterator[Any]:
        """The engine's stream; input it rejects becomes an error message, not a crash."""
        try:
            async for item in self._engine.generate(req):
                yield item
        except ValueError as e:
            yield {"replica": self._replica, "error": str(e), "status": 400}

    def _final(self, item: Finished) -> dict[str, Any]:
        u = item.usage
        msg: dict[str, Any] = {
            "replica": self._replica,
            "finish_reason": item.finish_reason,
            "stop_sequence": item.stop_sequence,
            "usage": {
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "cached_tokens": u.cached_tokens,
            },
        }
        if self._publisher is None:
            msg["events"] = to_wire(self._engine.drain_cache_events())
        return msg

    async def load(self) -> dict[str, Any]:
        stats = self._engine.load()
        return {
            "replica": self._replica,
            "node": self._node,
            "http": self._direct.address if self._direct else None,
            **stats.routing_stats(),
        }

    async def record_routing_stats(self) -> dict[str, Any]:
        return await self.load()

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def __del__(self) -> None:
        if self._direct is not None:
            await self._direct.stop()
        if self._publisher is not None:
            await self._publisher.stop()
        await self._engine.shutdown()
        shutdown_tracing()
