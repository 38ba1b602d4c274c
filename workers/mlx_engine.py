"""The mlx engine: mlx-lm on Apple silicon (Metal) or CPU MLX on Linux.

All MLX work runs on one dedicated thread, owned and stopped by the engine, so
the Serve replica's event loop never blocks. Each request reuses the longest
cached prefix from a ``PrefixKVStore`` (trimming a longer entry where needed),
prefills only the rest, and stores its KV back; the store turns that into
precise block events for the router's index.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cache_service.events import CacheEvent
from cache_service.hashing import model_salt
from workers.kv_store import PrefixKVStore
from workers.protocol import (
    EngineError,
    Finished,
    GenerateRequest,
    LoadStats,
    TokenChunk,
    Usage,
)
from workers.stops import StopMatcher

log = logging.getLogger(__name__)
_DONE = object()


@dataclass(slots=True)
class _Job:
    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    aborted: threading.Event = field(default_factory=threading.Event)

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class MlxEngine:
    def __init__(
        self,
        model_path: str,
        model_name: str,
        replica_id: str,
        block_size: int,
        cache_bytes: int = 1 << 30,
        max_cache_entries: int = 64,
    ) -> None:
        self._path, self._name, self._replica = model_path, model_name, replica_id
        self._block_size, self._cache_bytes = block_size, cache_bytes
        self._max_entries = max_cache_entries
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvroute-mlx")
        self._model: Any = None
        self._tokenizer: Any = None
        self._store: PrefixKVStore[list[Any]] | None = None
        self._jobs: dict[str, _Job] = {}
        self._queued_tokens = 0
        self._events_lock = threading.Lock()

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load)

    def _load(self) -> None:
        try:
            from mlx_lm import load
        except ImportError as e:  # pragma: no cover - depends on the install
            raise EngineError(
                "the mlx engine needs the 'mlx' extra: pip install 'kvroute[mlx]'"
            ) from e
        self._model, self._tokenizer = load(self._path)
        self._store = PrefixKVStore(
            self._name, self._replica, self._cache_bytes, self._block_size,
            model_salt(self._name), _kv_nbytes, self._max_entries,
        )

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]:
        if not request.token_ids:
            raise EngineError("empty prompt")
        loop = asyncio.get_running_loop()
        job = _Job(request, loop, asyncio.Queue())
        self._jobs[request.request_id] = job
        self._queued_tokens += len(request.token_ids)
        fut = loop.run_in_executor(self._pool, self._run_guarded, job)
        try:
            while (item := await job.queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise EngineError(str(item)) from item
                yield item
        finally:
            job.aborted.set()  # the consumer left: stop generating
            self._jobs.pop(request.request_id, None)
            await asyncio.shield(fut)

    async def abort(self, request_id: str) -> None:
        if job := self._jobs.get(request_id):
            job.aborted.set()

    def drain_cache_events(self) -> list[CacheEvent]:
        with self._events_lock:
            return self._store.drain_events() if self._store else []

    def load(self) -> LoadStats:
        used = self._store.nbytes / self._cache_bytes if self._store else 0.0
        return LoadStats(len(self._jobs), self._queued_tokens, min(1.0, used))

    async def check_health(self) -> None:
        if self._model is None or self._pool._shutdown:  # noqa: SLF001
            raise EngineError("mlx engine not running")

    async def shutdown(self) -> None:
        for job in self._jobs.values():
            job.aborted.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run_guarded(self, job: _Job) -> None:
        started = False
        try:
            self._queued_tokens -= len(job.request.token_ids)
            started = True
            self._run(job)
        except Exception as e:  # surfaced to the caller as EngineError
            log.exception("mlx generation failed")
            job.put(e)
        finally:
            if not started:
                self._queued_tokens -= len(job.request.token_ids)
            job.put(_DONE)

    def _run(self, job: _Job) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_sampler

        req, sp = job.request, job.request.sampling
        if job.aborted.is_set():
            return job.put(Finished(Usage(len(req.token_ids), 0, 0), "abort"))
        cache, reused = self._fetch_cache(req.token_ids)
        if sp.seed is not None:
            mx.random.seed(sp.seed)
        steps = generate_step(
            mx.array(req.token_ids[reused:]), self._model, prompt_cache=cache,
            max_tokens=sp.max_tokens, sampler=make_sampler(sp.temperature, sp.top_p),
        )
        generated, reason = self._decode(job, steps)
        self._store_cache(req.token_ids + generated, cache)
        job.put(Finished(Usage(len(req.token_ids), len(generated), reused), reason))

    def _decode(self, job: _Job, steps: Any) -> tuple[list[int], str]:
        sp = job.request.sampling
        detok, stops = self._tokenizer.detokenizer, StopMatcher(sp.stop)
        eos = set() if sp.ignore_eos else set(self._tokenizer.eos_token_ids)
        generated: list[int] = []
        reason = "length"
        for token, _ in steps:
            token = int(token)
            if job.aborted.is_set():
                return generated, "abort"
            if token in eos:
                reason = "stop"
                break
            generated.append(token)
            detok.add_token(token)
            text, hit = stops.feed(detok.last_segment)
            if text or hit:
                job.put(TokenChunk(text, (token,)))
            if hit:
                return generated, "stop"
            if len(generated) >= sp.max_tokens:
                break
        detok.finalize()
        if tail := stops.feed(detok.last_segment)[0] + stops.flush():
            job.put(TokenChunk(tail, ()))
        return generated, reason

    def _fetch_cache(self, prompt: list[int]) -> tuple[list[Any], int]:
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        assert self._store is not None
        match = self._store.nearest(prompt)
        reuse = min(match.common, len(prompt) - 1) if match else 0
        if not match or reuse <= 0:
            return make_prompt_cache(self._model), 0
        cache = copy.deepcopy(match.kv)
        trim_prompt_cache(cache, _offset(cache) - reuse)
        return cache, reuse

    def _store_cache(self, tokens: list[int], cache: list[Any]) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        assert self._store is not None
        offset = _offset(cache)
        if offset > len(tokens):
            trim_prompt_cache(cache, offset - len(tokens))
            offset = len(tokens)
        with self._events_lock:
            self._store.insert(tokens[:offset], cache)


def _offset(cache: list[Any]) -> int:
    return int(cache[0].offset)


def _kv_nbytes(cache: list[Any]) -> int:
    return int(sum(c.nbytes for c in cache))
