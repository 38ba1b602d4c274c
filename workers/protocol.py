"""The narrow engine protocol every worker engine (mlx, vllm, sim) implements.

The Serve deployment in ``workers.deployment`` is a thin shim over this: it feeds
token ids in, streams ``TokenChunk``s out, ends with ``Finished`` (usage measured
by the engine itself), and forwards the engine's cache events to the index.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cache_service.events import CacheEvent


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True, slots=True)
class TokenChunk:
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    usage: Usage
    finish_reason: str  # "stop" | "length" | "abort"
    stop_sequence: str | None = None  # the stop string that ended it, if one did


@dataclass(frozen=True, slots=True)
class LoadStats:
    ongoing_requests: int
    queued_prefill_tokens: int
    kv_usage: float  # fraction of the KV budget in use, 0..1


class EngineError(RuntimeError):
    """The engine failed a request (not the caller's fault)."""


@runtime_checkable
class Engine(Protocol):
    """What the worker deployment needs from an engine."""

    async def start(self) -> None: ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finished]: ...

    async def abort(self, request_id: str) -> None: ...

    def drain_cache_events(self) -> list[CacheEvent]: ...

    def load(self) -> LoadStats: ...

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...
