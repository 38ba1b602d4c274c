"""The mlx engine: mlx-lm on Apple silicon (Metal) or CPU MLX on Linux.

Concurrent requests are served with continuous batching: one dedicated engine
thread (``workers.engines.mlx.batch.BatchLoop``) drives mlx-lm's ``BatchGenerator``, so a
new request is prefilled and joins the decode batch while others are generating.
All MLX work, model load included, runs on that thread; the Serve replica's event
loop only submits requests, reads per-request asyncio queues, and cancels.

Each request reuses the longest cached prefix from a ``PrefixKVStore`` (trimming a
longer entry where needed), prefills only the rest, and stores its KV back on
finish; the store turns that into precise block events for the router's index.
``load()`` reports running requests, uncached prompt tokens not yet prefilled (the
running prefill only its rest; a request still in the inbox counts its whole prompt
until its cache lookup), the KV in the store plus in the running batch as a fraction
of ``cache_bytes``, and mlx-lm's cumulative prompt tokens and prompt seconds (from
which the router learns the replica's prefill rate).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator

from cache_service.events import CacheEvent
from workers.engines.mlx.batch import BatchLoop, SamplingError
from workers.engines.mlx.grammar import GrammarError
from workers.engines.mlx.jobs import BatchConfig, Job
from workers.engines.mlx.kv_disk import reload_cost
from workers.protocol import (
    EngineError,
    Finished,
    GenerateRequest,
    LoadStats,
    TokenChunk,
    take_ready,
)


class MlxEngine:
    """An mlx-lm replica with continuous batching (see the module docstring).

    ``max_batch`` sequences decode together; ``prefill_step_size`` (chunk tokens) and
    ``prefill_batch_size`` (prompts prefilled together) default by device, see
    ``BatchLoop._prefill_settings``.
    """

    kv_events_endpoint: str | None = None  # its events reach the index only

    def __init__(
        self,
        model_path: str,
        model_name: str,
        replica_id: str,
        block_size: int,
        cache_bytes: int = 1 << 30,
        max_cache_entries: int = 64,
        prefill_step_size: int | None = None,
        max_batch: int = 32,
        prefill_batch_size: int | None = None,
        disk_bytes: int = 0,
        disk_path: str | None = None,
        lease_fraction: float = 0.25,
    ) -> None:
        self._cfg = BatchConfig(
            model_path, model_name, replica_id, block_size, cache_bytes,
            max_cache_entries, prefill_step_size, max_batch, prefill_batch_size,
            disk_bytes, disk_path, lease_fraction,
        )
        self._core = BatchLoop(self._cfg)
        self._thread: threading.Thread | None = None
        self._jobs: dict[str, Job] = {}

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._core.run, name=f"kvroute-mlx-{self._cfg.replica_id}", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(self._core.ready)
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"mlx engine failed to load {self._cfg.model_path}: {e}") from e

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]:
        rid = request.request_id
        if not request.token_ids:
            raise EngineError("empty prompt")
        if self._thread is None:
            raise EngineError("mlx engine not running")
        if rid in self._jobs:
            raise EngineError(f"request {rid!r} is already running")
        job = Job(request, asyncio.get_running_loop(), asyncio.Queue())
        self._core.submit(job)
        self._jobs[rid] = job
        done = False
        try:
            while not done:
                for item in take_ready(await job.queue.get(), job.queue):
                    done = isinstance(item, Finished | BaseException)
                    if done:  # not ongoing any more, even if the consumer never resumes us
                        self._forget(job)
                    # this job's input alone (sampling, a grammar): a 400
                    if isinstance(item, SamplingError | GrammarError):
                        raise item
                    if isinstance(item, BaseException):
                        raise EngineError(f"mlx generation failed: {item}") from item
                    yield item
                    if done:
                        break
        finally:
            self._forget(job)
            if not done:  # the consumer left early: take the sequence out of the batch
                job.aborted.set()
                self._core.cancel(job)

    def _forget(self, job: Job) -> None:
        if self._jobs.get(job.request.request_id) is job:
            del self._jobs[job.request.request_id]

    async def abort(self, request_id: str) -> None:
        if job := self._jobs.get(request_id):
            job.aborted.set()
            self._core.cancel(job)  # the engine thread answers with Finished("abort")

    def drain_cache_events(self) -> list[CacheEvent]:
        store = self._core.store
        if store is None:
            return []
        with self._core.events_lock:
            return store.drain_events()

    def load(self) -> LoadStats:
        jobs = list(self._jobs.values())
        store = self._core.store
        used = (store.nbytes if store else 0) + self._core.active_bytes
        return LoadStats(
            len(jobs),
            sum(j.prefill_left for j in jobs),
            min(1.0, used / self._cfg.cache_bytes),
            remaining_prefill_exact=True,
            prefill_tokens_total=self._core.prefill_tokens_total,
            prefill_busy_s=self._core.prefill_busy_s,
            decode_batch=sum(1 for j in jobs if j.prefill_left == 0),
            reload_cost=reload_cost(store.disk if store else None,
                                    self._core.prefill_tokens_total, self._core.prefill_busy_s),
        )

    async def check_health(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive() or self._core.closed:
            raise EngineError("mlx engine not running")

    async def shutdown(self) -> None:
        if self._thread is None:
            return
        self._core.stop()
        await asyncio.to_thread(_join_native, self._thread)


def _join_native(thread: threading.Thread, timeout_s: float = 2.0) -> None:
    """Join, then wait until the OS thread is gone (Linux; bounded).

    ``join()`` returns before the thread runs its C++ thread-local destructors; MLX's
    (its per-thread random state) take the GIL, and if the interpreter is finalizing by
    then the process aborts ("terminate called without an active exception").
    """
    thread.join()
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + timeout_s
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)
