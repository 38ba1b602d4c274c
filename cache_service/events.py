"""KV-cache events reported by engine workers to the prefix index.

Hashes are the chained block hashes of ``cache_service.hashing.block_hashes`` (router block
size, not the engine's), so the router and the workers talk about the same blocks.

* ``BlockStored``: the replica now holds these prefix blocks in ``tier`` (confirmed; long TTL).
* ``BlockRemoved``: the replica dropped these blocks from ``tier`` (copies in another tier stay).
* ``AllBlocksCleared``: the replica dropped its whole cache, every tier (restart, reset, reload).

``tier`` is where the KV sits: ``device`` (accelerator memory: a hit is free), ``host`` (CPU
memory) or ``disk``: a hit there costs a reload the router prices (``router.routing.estimates``). An
event without a tier (older workers) means ``device``. A block may be held in several tiers
at once (vLLM's CPU offloading keeps copies); the index keeps the set per (block, replica).

Events are applied in order; a batch may mix models and replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEVICE", "TIERS", "AllBlocksCleared", "BlockRemoved", "BlockStored", "CacheEvent", "Tier",
    "tier_bit",
]

Tier = Literal["device", "host", "disk"]
DEVICE: Tier = "device"
TIERS: tuple[Tier, ...] = ("device", "host", "disk")


def tier_bit(tier: Tier) -> int:
    """The tier as one bit of the index's per-entry tier set (device = 1)."""
    return 1 << TIERS.index(tier)


@dataclass(frozen=True, slots=True)
class _BlockEvent:
    model: str
    replica: str
    hashes: tuple[int, ...]
    tier: Tier = DEVICE

    def __post_init__(self) -> None:
        # Accept any iterable of ints but keep the event immutable and hashable.
        if not isinstance(self.hashes, tuple):
            object.__setattr__(self, "hashes", tuple(self.hashes))
        if self.tier not in TIERS:
            raise ValueError(f"unknown KV tier {self.tier!r}; known: {TIERS}")


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
