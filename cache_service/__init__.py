"""Prefix-locality index shared by kvroute routers and workers.

``hashing.block_hashes`` turns token ids into chained block hashes; the router looks them up
in a ``PrefixIndex`` (embedded ``MemoryPrefixIndex`` or shared ``RedisPrefixIndex`` wrapped in
``ResilientIndex``) to find the replica that already holds the longest prefix in its KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

from deploy.config import IndexConfig

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
    "index_from_config",
    "make_index",
    "model_salt",
    "settings_of",
]


def make_index(
    redis_url: str | None,
    settings: IndexSettings,
    on_error: Callable[[str], None] | None = None,
    timeout_s: float = 0.05,
    **resilience: float,
) -> PrefixIndex:
    """``ResilientIndex(Redis, memory)`` when a URL is given, else an embedded memory index.

    ``on_error(op)`` is called on each primary failure (e.g. to count
    ``kvroute_index_errors_total``); ``timeout_s`` is Redis's socket timeout; ``resilience``
    (``backoff_s``, ``op_timeout_s``, ``maintenance_timeout_s``) goes to ``ResilientIndex``.
    """
    if not redis_url:
        return MemoryPrefixIndex(settings)
    primary = RedisPrefixIndex(redis_url, settings, timeout_s=timeout_s)
    return ResilientIndex(primary, MemoryPrefixIndex(settings), on_error, **resilience)


def settings_of(cfg: IndexConfig) -> IndexSettings:
    """The config's ``index`` section as the index's settings: the one place they map."""
    return IndexSettings(namespace=cfg.namespace, routed_ttl_s=cfg.routed_ttl_s,
                         stored_ttl_s=cfg.stored_ttl_s, liveness_ttl_s=cfg.liveness_ttl_s,
                         session_ttl_s=cfg.session_ttl_s)


def index_from_config(cfg: IndexConfig,
                      on_error: Callable[[str], None] | None = None) -> PrefixIndex:
    """The prefix index a router or worker process uses, from the config's ``index``."""
    return make_index(cfg.redis_url, settings_of(cfg), on_error, timeout_s=cfg.timeout_s,
                      backoff_s=cfg.backoff_s, op_timeout_s=cfg.op_timeout_s,
                      maintenance_timeout_s=cfg.maintenance_timeout_s)
