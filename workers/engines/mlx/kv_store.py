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

Disk tier (``disk``, a ``workers.engines.mlx.kv_disk.DiskTier``): an entry evicted for room is
written
to disk instead of vanishing (its blocks: ``BlockStored(disk)`` then ``BlockRemoved``
from the device), and a prompt whose best match is on disk reads it back into memory
(``BlockStored`` on the device, ``BlockRemoved(disk)``); ``Match.tier`` says where it came
from. A failed write or read is a miss, never an error.

Leases (``insert(..., lease_s)``, ``router.routing.leases``): an entry inserted with a lease is
evicted only when no unleased (or expired) entry is left; leased entries hold at most
``lease_fraction`` of ``max_bytes``: an entry that does not fit gets no lease (the leases
held stay: a stable warm subset, as in ``workers.engines.sim.kv``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from cache_service.events import BlockRemoved, BlockStored, CacheEvent, Tier
from cache_service.hashing import block_hashes, tenant_salt
from workers.engines.mlx.kv_disk import DiskTier

KV = TypeVar("KV")
_Key = tuple[str | None, tuple[int, ...]]  # (cache salt, tokens)


@dataclass(slots=True)
class _Entry(Generic[KV]):
    key: _Key
    tokens: tuple[int, ...]
    kv: KV
    nbytes: int
    hashes: list[int]
    lease_until: float = 0.0


@dataclass(frozen=True, slots=True)
class Match(Generic[KV]):
    tokens: tuple[int, ...]  # the entry's key
    kv: KV
    common: int  # tokens shared with the prompt
    tier: Tier = "device"  # where the KV was found ("disk": read back from the disk tier)


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
        disk: DiskTier[KV] | None = None,
        lease_fraction: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model, self.replica = model, replica
        self.disk, self.lease_fraction, self._clock = disk, lease_fraction, clock
        self._disk_refs: dict[int, int] = {}
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.block_size, self.salt = block_size, salt
        self._nbytes_of = nbytes_of
        self._entries: OrderedDict[_Key, _Entry[KV]] = OrderedDict()
        self._refs: dict[int, int] = {}
        self._events: list[CacheEvent] = []
        self.nbytes = 0
        for entry in disk.entries.values() if disk is not None else ():  # a restart's files
            self._disk_stored(entry.hashes)

    def __len__(self) -> int:
        return len(self._entries)

    def nearest(self, prompt: list[int], cache_salt: str | None = None) -> Match[KV] | None:
        """The entry of ``cache_salt`` sharing the longest prefix with ``prompt`` (marked
        recently used), in memory or on disk (read back into memory); entries of other
        salts are never matched."""
        best, best_common = _longest(self._entries, prompt, cache_salt)
        if self.disk is not None:
            key, common = _longest(self.disk.entries, prompt, cache_salt)
            # A read costs a file: only for at least a block more than memory offers.
            if key is not None and common >= best_common + self.block_size:
                kv = self._from_disk(key)
                if kv is not None:
                    return Match(key[1], kv, common, "disk")
        if best is None:
            return None
        entry = self._entries[best]
        self._entries.move_to_end(best)
        return Match(entry.tokens, entry.kv, best_common)

    def _from_disk(self, key: _Key) -> KV | None:
        """Read an entry back into memory (where it may spill again if it is too big)."""
        assert self.disk is not None
        hashes = self.disk.entries[key].hashes
        kv = self.disk.take(key)  # the file goes either way
        self._disk_decref(hashes)
        if kv is not None:
            self.insert(list(key[1]), kv, key[0])
        return kv

    def insert(self, tokens: list[int], kv: KV, cache_salt: str | None = None,
               lease_s: float = 0.0) -> None:
        """Store ``kv`` for ``tokens`` under ``cache_salt``; drops that salt's entries that
        are strict prefixes of it. ``lease_s``: keep it ahead of unleased entries that long."""
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
        if lease_s > 0 and self._lease_room() >= entry.nbytes:
            entry.lease_until = self._clock() + lease_s
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        self._evict()

    def clear(self) -> None:
        for key in list(self._entries):
            self._remove(key)
        if self.disk is not None:
            for key in list(self.disk.entries):
                self._disk_decref(self.disk.remove(key).hashes)

    def release(self) -> None:
        """The replica stops: every block leaves the index (``BlockRemoved``), memory is
        freed, and a persistent disk tier's files stay for the next replica on its folder."""
        for key in list(self._entries):
            self._remove(key)
        if self.disk is not None:
            for entry in self.disk.entries.values():
                self._disk_decref(entry.hashes)
            self.disk.close()

    def drain_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    def held_hashes(self) -> set[int]:
        return set(self._refs)

    def _evict(self) -> None:
        while self._entries and (
            self.nbytes > self.max_bytes or len(self._entries) > self.max_entries
        ):
            self._spill(self._victim())

    def _victim(self) -> _Key:
        """The least recently used unleased (or expired) entry; the oldest if all leased."""
        now = self._clock()
        for key, entry in self._entries.items():
            if entry.lease_until <= now:
                return key
        return next(iter(self._entries))

    def _lease_room(self) -> float:
        """Bytes leases may still hold (``lease_fraction`` of the budget, less live leases)."""
        now = self._clock()
        held = sum(e.nbytes for e in self._entries.values() if e.lease_until > now)
        return self.lease_fraction * self.max_bytes - held

    def _spill(self, key: _Key) -> None:
        """Evict ``key`` for room: to the disk tier if there is one, else it is gone."""
        entry = self._entries[key]
        if self.disk is not None and key in self.disk.entries:
            self.disk.entries.move_to_end(key)  # already there (and counted)
        elif self.disk is not None:
            dropped = self.disk.put(key, entry.kv, entry.hashes)
            if dropped is not None:
                self._disk_stored(entry.hashes)
                for gone in dropped:
                    self._disk_decref(gone.hashes)
        self._remove(key)

    def _disk_stored(self, hashes: list[int]) -> None:
        new = [h for h in hashes if _incref(self._disk_refs, h)]
        if new:
            self._events.append(BlockStored(self.model, self.replica, tuple(new), "disk"))

    def _disk_decref(self, hashes: list[int]) -> None:
        gone = [h for h in hashes if _decref(self._disk_refs, h)]
        if gone:
            self._events.append(BlockRemoved(self.model, self.replica, tuple(gone), "disk"))

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        removed = [h for h in entry.hashes if self._decref(h)]
        if removed:
            self._events.append(BlockRemoved(self.model, self.replica, tuple(removed)))

    def _incref(self, h: int) -> bool:
        return _incref(self._refs, h)

    def _decref(self, h: int) -> bool:
        return _decref(self._refs, h)


def _incref(refs: dict[int, int], h: int) -> bool:
    refs[h] = refs.get(h, 0) + 1
    return refs[h] == 1


def _decref(refs: dict[int, int], h: int) -> bool:
    n = refs[h] - 1
    if n:
        refs[h] = n
        return False
    del refs[h]
    return True


def _longest(entries: Iterable[_Key], prompt: list[int],
             cache_salt: str | None) -> tuple[_Key | None, int]:
    """The key of ``cache_salt`` sharing the longest prefix with ``prompt``, and its length."""
    best: _Key | None = None
    best_common = 0
    for key in entries:
        if key[0] != cache_salt:
            continue
        common = _common_prefix(key[1], prompt)
        if common > best_common:
            best, best_common = key, common
    return best, best_common
