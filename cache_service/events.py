"""KV-cache events reported by engine workers to the prefix index.

Hashes are the chained block hashes of ``cache_service.hashing.block_hashes`` (router block
size, not the engine's), so the router and the workers talk about the same blocks.

* ``BlockStored``: the replica now holds these prefix blocks (confirmed; long TTL).
* ``BlockRemoved``: the replica evicted these blocks.
* ``AllBlocksCleared``: the replica dropped its whole cache (restart, reset, model reload).

Events are applied in order; a batch may mix models and replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "CacheEvent"]


@dataclass(frozen=True, slots=True)
class _BlockEvent:
    model: str
    replica: str
    hashes: tuple[int, ...]

    def __post_init__(self) -> None:
        # Accept any iterable of ints but keep the event immutable and hashable.
        if not isinstance(self.hashes, tuple):
            object.__setattr__(self, "hashes", tuple(self.hashes))


@dataclass(frozen=True, slots=True)
class BlockStored(_BlockEvent):
    pass


@dataclass(frozen=True, slots=True)
class BlockRemoved(_BlockEvent):
    pass


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    model: str
    replica: str


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
