"""The records the mlx adapter (``workers.engines.mlx.engine``, on the event loop) and its batch
loop (``workers.engines.mlx.batch``, on the engine thread) share: one request, one loop config."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from workers.protocol import GenerateRequest, Usage


@dataclass(slots=True, eq=False)  # identity equality
class Job:
    """One request as both threads see it."""

    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    aborted: threading.Event = field(default_factory=threading.Event)
    prefill_left: int = 0  # uncached prompt tokens not yet prefilled (engine thread writes)
    uid: int | None = None  # BatchGenerator uid once inserted
    disk_reused: int = 0  # of the reused prompt tokens, those read back from the disk tier

    def usage(self, generated: int, reused: int) -> Usage:
        return Usage(len(self.request.token_ids), generated, reused, min(self.disk_reused, reused))

    def __post_init__(self) -> None:
        self.prefill_left = len(self.request.token_ids)  # until the cache lookup says less

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            pass


@dataclass(frozen=True, slots=True)
class BatchConfig:
    model_path: str
    model_name: str
    replica_id: str
    block_size: int
    cache_bytes: int
    max_cache_entries: int
    prefill_step_size: int | None = None  # None: by device (BatchLoop._prefill_settings)
    max_batch: int = 32  # sequences decoding together (mlx-lm's decode concurrency)
    prefill_batch_size: int | None = None
    disk_bytes: int = 0  # the prefix store's disk tier (0: none; workers.engines.mlx.kv_disk)
    disk_path: str | None = None  # its folder (None: a private temporary one)
    lease_fraction: float = 0.25  # most of cache_bytes that leased entries may hold
