"""Embedded, single-process prefix index (also the local fallback of ``ResilientIndex``).

Data layout (all plain dicts; no awaits inside methods, so every call is atomic on the loop,
but for ``record_routed``, which writes a long prompt in steps):

* ``_blocks``: ``OrderedDict[(model, hash)] -> {replica: expiry}`` in least-recently-written
  order.
* ``_by_replica``: ``(model, replica) -> {hash: expiry}``, the same entries by replica: for
  O(own entries) purges, and for lookups, which find each replica's leading run of live
  entries in C-level passes over its dict (one Python step per block and holder cost ~1 ms
  for a 15k-token prompt, every request). O(matched blocks x replicas), never O(index).
  ``_rep_expiry``: the max expiry of the replica's entries (it "holds entries" until then).
* ``_tiers``: ``(model, hash, replica) -> tier bits`` only for entries not held on the device
  alone (``events.tier_bit``); absent means device, so a single-tier fleet pays nothing.
* ``_heartbeats`` / ``_tombstones``: ``model -> {replica: time}`` for liveness (see ``index``).

Memory is bounded: entries carry an expiry (expired ones are invisible at once and deleted
lazily when a lookup or write touches them, plus a small sweep of the LRU head on each write),
and ``settings.memory_max_entries`` caps the (block, replica) entries: the least recently
written blocks are dropped first. ``stats().blocks`` counts entries not yet deleted (it may
include expired ones awaiting the lazy sweep).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, count, islice, repeat
from operator import not_

import xxhash

from .events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent, Tier, tier_bit
from .index import IndexSettings, IndexStats, Match, MatchInfo

__all__ = ["MemoryPrefixIndex"]

_SWEEP_PER_WRITE = 16  # LRU-head keys examined per write for expired entries
# Blocks per step of a routed write: a cold 156k-token prompt's 2.4k new blocks in one
# step held the event loop 7-10 ms, and every stream on the router with it.
_WRITE_STEP = 512

BlockKey = tuple[str, int]
RepKey = tuple[str, str]
EntryKey = tuple[str, int, str]  # model, hash, replica
_DEVICE = tier_bit("device")
MAX_SESSIONS = 100_000  # sessions remembered per process (LRU beyond)
_ABSENT = -math.inf  # the expiry of an entry a replica does not have


class MemoryPrefixIndex:
    """In-process ``PrefixIndex``. ``clock`` is injectable for tests (seconds, monotonic)."""

    def __init__(
        self,
        settings: IndexSettings = IndexSettings(),  # noqa: B008 - frozen, immutable default
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._blocks: OrderedDict[BlockKey, dict[str, float]] = OrderedDict()
        self._by_replica: dict[RepKey, dict[int, float]] = {}
        self._rep_expiry: dict[RepKey, float] = {}
        self._entries = 0
        self._tiers: dict[EntryKey, int] = {}
        self._heartbeats: dict[str, dict[str, float]] = {}
        self._tombstones: dict[str, dict[str, float]] = {}
        self._sessions: OrderedDict[bytes, tuple[str, str, float]] = OrderedDict()  # LRU

    # ---- liveness -------------------------------------------------------------------------

    def _is_dead(self, model: str, replica: str, now: float) -> bool:
        tomb = self._tombstones.get(model, {}).get(replica)
        if tomb is not None and now - tomb < self.settings.tombstone_ttl_s:
            return True
        beat = self._heartbeats.get(model, {}).get(replica)
        return beat is not None and now - beat > self.settings.liveness_ttl_s

    def _is_tombstoned(self, model: str, replica: str, now: float) -> bool:
        tomb = self._tombstones.get(model, {}).get(replica)
        return tomb is not None and now - tomb < self.settings.tombstone_ttl_s

    # ---- entry bookkeeping ----------------------------------------------------------------

    def _drop_entry(self, key: BlockKey, holders: dict[str, float], replica: str) -> None:
        """Delete one (block, replica) entry; the caller removes ``key`` if holders empties."""
        del holders[replica]
        self._entries -= 1
        if self._tiers:
            self._tiers.pop((key[0], key[1], replica), None)
        rk = (key[0], replica)
        own = self._by_replica.get(rk)
        if own is not None:
            own.pop(key[1], None)
            if not own:
                del self._by_replica[rk]
                self._rep_expiry.pop(rk, None)

    def _drop_expired(self, key: BlockKey, holders: dict[str, float], now: float) -> None:
        for replica in [r for r, exp in holders.items() if exp <= now]:
            self._drop_entry(key, holders, replica)
        if not holders:
            self._blocks.pop(key, None)

    def _set_tiers(self, ek: EntryKey, bits: int) -> None:
        if bits == _DEVICE:
            self._tiers.pop(ek, None)
        else:
            self._tiers[ek] = bits

    def _write(self, model: str, replica: str, hashes: Iterable[int], ttl: float,
               bit: int = _DEVICE) -> None:
        now = self._clock()
        if self._is_tombstoned(model, replica, now):
            return  # late write for a removed replica must not resurrect it
        expiry = now + ttl
        rk = (model, replica)
        own = self._by_replica.setdefault(rk, {})
        blocks, to_end = self._blocks, self._blocks.move_to_end
        # a device write into a single-tier index never adds tier entries: test it once
        tiered = bit != _DEVICE or bool(self._tiers)
        added = 0
        for h in hashes:
            key = (model, h)
            holders = blocks.get(key)
            if holders is None:
                holders = blocks[key] = {}
            else:
                to_end(key)
            old = holders.get(replica)
            if old is None:
                added += 1
                own[h] = holders[replica] = expiry
            elif old < expiry:
                own[h] = holders[replica] = expiry
            if not tiered:
                continue
            if old is None or old <= now:  # new (or expired): only this tier holds it
                self._set_tiers((model, h, replica), bit)
            else:
                ek = (model, h, replica)
                self._set_tiers(ek, self._tiers.get(ek, _DEVICE) | bit)
        self._entries += added
        if not own:
            del self._by_replica[rk]
            return
        self._rep_expiry[rk] = max(self._rep_expiry.get(rk, 0.0), expiry)
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop expired entries at the LRU head, then evict LRU blocks beyond the cap."""
        for _ in range(_SWEEP_PER_WRITE):
            if not self._blocks:
                break
            key, holders = next(iter(self._blocks.items()))
            self._drop_expired(key, holders, now)
            if key in self._blocks:
                break  # head still has live entries: stop, it is the next LRU victim
        cap = self.settings.memory_max_entries
        while self._entries > cap and self._blocks:
            key, holders = next(iter(self._blocks.items()))
            for replica in list(holders):
                self._drop_entry(key, holders, replica)
            self._blocks.pop(key, None)

    def _remove(self, model: str, replica: str, hashes: Iterable[int],
                bit: int = _DEVICE) -> None:
        for h in hashes:
            key = (model, h)
            holders = self._blocks.get(key)
            if holders is not None and replica in holders:
                ek = (model, h, replica)
                left = self._tiers.get(ek, _DEVICE) & ~bit if self._tiers else _DEVICE & ~bit
                if left:  # still held in another tier
                    self._set_tiers(ek, left)
                    continue
                self._drop_entry(key, holders, replica)
                if not holders:
                    del self._blocks[key]

    def _purge(self, model: str, replica: str) -> None:
        own = self._by_replica.get((model, replica))
        if own:
            self._remove(model, replica, list(own), bit=~0)  # every tier
        self._by_replica.pop((model, replica), None)
        self._rep_expiry.pop((model, replica), None)

    # ---- PrefixIndex ----------------------------------------------------------------------

    async def lookup(self, hashes_by_model: Mapping[str, Sequence[int]]) -> MatchInfo:
        now = self._clock()
        return {m: self._match(m, hashes, now) for m, hashes in hashes_by_model.items()}

    def _match(self, model: str, hashes: Sequence[int], now: float) -> dict[str, int]:
        runs = self._runs(model, hashes, float(now))
        return runs if runs is not None else self._walk(model, hashes, now)

    def _runs(self, model: str, hashes: Sequence[int], now: float) -> dict[str, int] | None:
        """Each live replica's leading run of live entries, in C-level passes over its own
        entries. None when a run ends at an expired entry: ``_walk`` then answers, and
        deletes the expired entries it meets (as it always did)."""
        result: dict[str, int] = {}
        for (m, replica), own in self._by_replica.items():
            if m != model or self._is_dead(model, replica, now):
                continue  # (dead first: the walk never reaches a dead one's expired entries)
            gone = map(now.__ge__, map(own.get, hashes, repeat(_ABSENT)))  # absent/expired
            n = next(compress(count(), gone), len(hashes))
            if n < len(hashes) and hashes[n] in own:
                return None
            if n == 0:
                continue
            device = n
            if self._tiers:  # the first block of the run held off the device only
                bits = map(self._tiers.get, zip(repeat(model), islice(hashes, n),
                                                repeat(replica)), repeat(_DEVICE))
                device = next(compress(count(), map(not_, map(_DEVICE.__and__, bits))), n)
            result[replica] = Match(n, n - device)
        return result

    def _walk(self, model: str, hashes: Sequence[int], now: float) -> dict[str, int]:
        """Block by block while a live candidate holds the block; deletes the expired
        entries it meets."""
        result: dict[str, int] = {}
        device_run: dict[str, int] = {}  # replicas whose match left the device: run length
        tiers = self._tiers
        candidates: set[str] | None = None
        dead: dict[str, bool] = {}
        for i, h in enumerate(hashes):
            key = (model, h)
            holders = self._blocks.get(key)
            if not holders:
                break
            survivors: set[str] = set()
            stale = False
            for replica, expiry in holders.items():
                if expiry <= now:
                    stale = True
                elif candidates is None or replica in candidates:
                    is_dead = dead.get(replica)
                    if is_dead is None:
                        is_dead = dead[replica] = self._is_dead(model, replica, now)
                    if not is_dead:
                        survivors.add(replica)
            if stale:
                self._drop_expired(key, holders, now)
            if not survivors:
                break
            for replica in survivors:
                result[replica] = i + 1
                if tiers and replica not in device_run:
                    if not tiers.get((model, h, replica), _DEVICE) & _DEVICE:
                        device_run[replica] = i
            candidates = survivors
        return {r: Match(n, n - device_run.get(r, n)) for r, n in result.items()}

    async def record_routed(self, model: str, replica: str, hashes: Sequence[int]) -> None:
        """``_WRITE_STEP`` blocks at a time, yielding to the loop between. A lookup in
        between sees a shorter leading run, and a routed entry is only a guess anyway."""
        for i in range(0, len(hashes), _WRITE_STEP):
            if i:
                await asyncio.sleep(0)
            self._write(model, replica, hashes[i:i + _WRITE_STEP], self.settings.routed_ttl_s)

    async def apply_events(self, events: Sequence[CacheEvent]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                self._write(ev.model, ev.replica, ev.hashes, self.settings.stored_ttl_s,
                            _bit(ev.tier))
            elif isinstance(ev, BlockRemoved):
                self._remove(ev.model, ev.replica, ev.hashes, _bit(ev.tier))
            elif isinstance(ev, AllBlocksCleared):
                self._purge(ev.model, ev.replica)
            else:
                raise TypeError(f"not a cache event: {ev!r}")

    async def session(self, session_id: str) -> tuple[str, str] | None:
        found = self._sessions.get(_session_digest(session_id))
        if found is None or found[2] <= self._clock():
            return None
        return found[0], found[1]

    async def record_session(self, session_id: str, model: str, replica: str) -> None:
        key = _session_digest(session_id)  # 16 bytes, however long the id
        self._sessions[key] = (model, replica, self._clock() + self.settings.session_ttl_s)
        self._sessions.move_to_end(key)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    async def heartbeat(self, model: str, replica: str) -> None:
        self._heartbeats.setdefault(model, {})[replica] = self._clock()
        self._tombstones.get(model, {}).pop(replica, None)

    def _known_replicas(self, model: str, now: float) -> set[str]:
        known = set(self._heartbeats.get(model, {}))
        known.update(r for (m, r), exp in self._rep_expiry.items() if m == model and exp > now)
        return {r for r in known if not self._is_dead(model, r, now)}

    async def live_replicas(self, model: str) -> set[str]:
        return self._known_replicas(model, self._clock())

    async def remove_replica(self, model: str, replica: str) -> None:
        self._tombstones.setdefault(model, {})[replica] = self._clock()
        self._heartbeats.get(model, {}).pop(replica, None)
        self._purge(model, replica)

    async def purge_dead(self) -> int:
        now = self._clock()
        live_ttl, tomb_ttl = self.settings.liveness_ttl_s, self.settings.tombstone_ttl_s
        expired = [
            (m, r)
            for m, beats in self._heartbeats.items()
            for r, t in beats.items()
            if now - t > live_ttl
        ]
        for model, replica in expired:
            await self.remove_replica(model, replica)
        for model, tombs in list(self._tombstones.items()):
            for replica in [r for r, t in tombs.items() if now - t >= tomb_ttl]:
                del tombs[replica]
            if not tombs:
                del self._tombstones[model]
        return len(expired)

    async def stats(self) -> IndexStats:
        now = self._clock()
        models = set(self._heartbeats) | {m for m, _ in self._by_replica}
        replicas = sum(len(self._known_replicas(m, now)) for m in models)
        return IndexStats(blocks=self._entries, replicas=replicas, backend="memory")

    async def close(self) -> None:
        return None


def _bit(tier: Tier) -> int:
    return _DEVICE if tier == "device" else tier_bit(tier)


def _session_digest(session_id: str) -> bytes:
    """What the index keeps of a session id: its xxh3-128 (as Redis keys do)."""
    return xxhash.xxh3_128_digest(session_id.encode())
