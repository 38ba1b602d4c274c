"""Prefix-locality index shared by kvroute routers and workers.

``hashing.block_hashes`` turns token ids into chained block hashes; the router looks them up
in a ``PrefixIndex`` (embedded ``MemoryPrefixIndex`` or shared ``RedisPrefixIndex`` wrapped in
``ResilientIndex``) to find the replica that already holds the longest prefix in its KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

from .events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from .hashing import DEFAULT_BLOCK_SIZE, block_hashes, model_salt
from .index import IndexSettings, IndexStats, MatchInfo, PrefixIndex
from .memory_index import MemoryPrefixIndex
from .redis_index import RedisPrefixIndex
from .resilient import ResilientIndex

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CacheEvent",
    "IndexSettings",
    "IndexStats",
    "MatchInfo",
    "MemoryPrefixIndex",
    "PrefixIndex",
    "RedisPrefixIndex",
    "ResilientIndex",
    "block_hashes",
    "make_index",
    "model_salt",
]


def make_index(
    redis_url: str | None,
    settings: IndexSettings,
    on_error: Callable[[str], None] | None = None,
) -> PrefixIndex:
    """``ResilientIndex(Redis, memory)`` when a URL is given, else an embedded memory index.

    ``on_error(op)`` is called on each primary failure (e.g. to count
    ``kvroute_index_errors_total``).
    """
    if not redis_url:
        return MemoryPrefixIndex(settings)
    primary = RedisPrefixIndex(redis_url, settings)
    return ResilientIndex(primary, MemoryPrefixIndex(settings), on_error)
