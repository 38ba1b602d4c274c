"""A multi-entry prefix KV store with precise block events.

Entries map a token sequence to an engine KV cache object (for mlx: a list of
per-layer caches). Lookup returns the entry sharing the longest prefix with a
prompt; the caller trims it to that prefix (mlx KV caches are trimmable), as
mlx-lm's server does with its ``LRUPromptCache``. Entries live under a byte
budget with LRU eviction.

Entries are kept per cache salt (the tenant, ``index.tenant_isolation``): a prompt only
ever reuses KV stored under its own salt, and the salt enters the block hashes of its events.

Unlike mlx-lm's cache, this one knows which canonical blocks it holds: each
entry covers the chained block hashes of its token prefix, a refcount per hash
says how many entries cover it, and a hash going 0→1 or 1→0 becomes a
``BlockStored``/``BlockRemoved`` event for the prefix index. That is what lets
the router route precisely to MLX replicas.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from cache_service.events import BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes, tenant_salt

KV = TypeVar("KV")
_Key = tuple[str | None, tuple[int, ...]]  # (cache salt, tokens)


@dataclass(slots=True)
class _Entry(Generic[KV]):
    key: _Key
    tokens: tuple[int, ...]
    kv: KV
    nbytes: int
    hashes: list[int]


@dataclass(frozen=True, slots=True)
class Match(Generic[KV]):
    tokens: tuple[int, ...]  # the entry's key
    kv: KV
    common: int  # tokens shared with the prompt


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixKVStore(Generic[KV]):
    """LRU of KV caches keyed by token prefixes, under a byte budget."""

    def __init__(
        self,
        model: str,
        replica: str,
        max_bytes: int,
        block_size: int,
        salt: int,
        nbytes_of: Callable[[KV], int],
        max_entries: int = 64,
    ) -> None:
        self.model, self.replica = model, replica
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.block_size, self.salt = block_size, salt
        self._nbytes_of = nbytes_of
        self._entries: OrderedDict[_Key, _Entry[KV]] = OrderedDict()
        self._refs: dict[int, int] = {}
        self._events: list[CacheEvent] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def nearest(self, prompt: list[int], cache_salt: str | None = None) -> Match[KV] | None:
        """The entry of ``cache_salt`` sharing the longest prefix with ``prompt`` (marked
        recently used); entries of other salts are never matched."""
        best: _Entry[KV] | None = None
        best_common = 0
        for (salt, _), entry in self._entries.items():
            if salt != cache_salt:
                continue
            common = _common_prefix(entry.tokens, prompt)
            if common > best_common:
                best, best_common = entry, common
        if best is None:
            return None
        self._entries.move_to_end(best.key)
        return Match(best.tokens, best.kv, best_common)

    def insert(self, tokens: list[int], kv: KV, cache_salt: str | None = None) -> None:
        """Store ``kv`` for ``tokens`` under ``cache_salt``; drops that salt's entries that
        are strict prefixes of it."""
        toks = tuple(tokens)
        key: _Key = (cache_salt, toks)
        hashes = block_hashes(tokens, self.block_size, tenant_salt(self.salt, cache_salt))
        stored = [h for h in hashes if self._incref(h)]  # before removals: no flapping
        if stored:
            self._events.append(BlockStored(self.model, self.replica, tuple(stored)))
        if key in self._entries:
            self._remove(key)
        shorter = [k for k in self._entries if k[0] == cache_salt and len(k[1]) < len(toks)]
        for other in [k for k in shorter if toks[: len(k[1])] == k[1]]:
            self._remove(other)  # a trimmable longer entry serves its prefixes too
        entry = _Entry(key, toks, kv, self._nbytes_of(kv), hashes)
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        self._evict()

    def clear(self) -> None:
        for key in list(self._entries):
            self._remove(key)

    def drain_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    def held_hashes(self) -> set[int]:
        return set(self._refs)

    def _evict(self) -> None:
        while self._entries and (
            self.nbytes > self.max_bytes or len(self._entries) > self.max_entries
        ):
            self._remove(next(iter(self._entries)))

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        removed = [h for h in entry.hashes if self._decref(h)]
        if removed:
            self._events.append(BlockRemoved(self.model, self.replica, tuple(removed)))

    def _incref(self, h: int) -> bool:
        self._refs[h] = self._refs.get(h, 0) + 1
        return self._refs[h] == 1

    def _decref(self, h: int) -> bool:
        n = self._refs[h] - 1
        if n:
            self._refs[h] = n
            return False
        del self._refs[h]
        return True
