"""The prefix-index protocol shared by the embedded and the Redis backends.

The index maps, per model, a chained block hash (``hashing.block_hashes``) to the replicas
that hold that prefix block, each entry with an expiry:

* ``record_routed``: the router just sent a request there; the engine will have the blocks as
  soon as prefill runs, so they count at once, with a short TTL (``routed_ttl_s``) in case no
  engine event ever confirms them.
* ``BlockStored`` events: engine-confirmed, long TTL (``stored_ttl_s``) so blocks age out if a
  ``BlockRemoved`` is lost. An entry's expiry only ever grows (max of all writes), so a routed
  write never shortens a stored entry.
* ``BlockRemoved`` / ``AllBlocksCleared``: delete entries at once.

Matching: for each model, a replica's match is the length of the longest run of consecutive
leading hashes (starting at index 0) it holds, unexpired. Since hashes are chained, a replica
holding ``h_5`` but not ``h_4`` gets 4; the walk stops as soon as no replica is left.

Tiers: each (block, replica) entry keeps the set of tiers holding it (``events.tier_bit``;
routed writes and tier-less events mean device). A match is a ``Match``: an ``int`` (the
matched blocks, in any tier, as before) whose ``host`` says how many of them are not on the
device: the match minus its leading run of device-held blocks, so the router prices them as a
reload. Same call, same round trip.

Liveness is "not known dead". A replica is dead when
  (a) it heartbeated and its last heartbeat is older than ``liveness_ttl_s``, or
  (b) it was removed (``remove_replica`` or ``purge_dead``): a tombstone is kept for
      ``tombstone_ttl_s`` (max of the entry TTLs), during which writes for it are dropped so a
      late routed write or event cannot resurrect it.
A replica that never heartbeated but has entries is live (the router may write before the
worker's first heartbeat lands). A heartbeat always makes a replica live again and clears its
tombstone (e.g. a restarted replica reusing its name; its old entries were purged).
Dead replicas never appear in ``lookup`` / ``live_replicas``, whether or not purged yet.

Sessions: ``record_session`` remembers the (model, replica) that last served a session
(``x-session-id``, Anthropic ``metadata.user_id``) for ``session_ttl_s``; ``session`` reads
it. Shared like the blocks, so a turn that reaches another router replica still finds where
its session's KV lives. Redis stores a digest of the session id, never the id itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .events import CacheEvent

__all__ = ["IndexSettings", "IndexStats", "Match", "MatchInfo", "PrefixIndex", "host_blocks"]


class Match(int):
    """Leading blocks a replica holds (an ``int``, so older callers see the count), and
    ``host``: how many of them sit in a slower tier (host memory, disk), past the replica's
    leading run of device-held blocks."""

    host: int

    def __new__(cls, blocks: int, host: int = 0) -> Match:
        obj = super().__new__(cls, blocks)
        obj.host = max(0, min(host, blocks))
        return obj

    def __repr__(self) -> str:
        return f"Match({int(self)}, host={self.host})" if self.host else str(int(self))

    def __reduce__(self) -> tuple[type[Match], tuple[int, int]]:
        return Match, (int(self), self.host)


MatchInfo = dict[str, dict[str, int]]
"""model -> replica -> leading blocks matched (a ``Match``; replicas with 0 may be omitted)."""


def host_blocks(matched: int) -> int:
    """The slower-tier part of a match (0 for a plain int)."""
    return getattr(matched, "host", 0)


@dataclass(frozen=True, slots=True)
class IndexSettings:
    namespace: str = "kvroute"
    routed_ttl_s: float = 120.0  # in-flight routed blocks count at once, expire if unconfirmed
    stored_ttl_s: float = 3600.0  # engine-confirmed blocks age out if events are lost
    liveness_ttl_s: float = 10.0  # replica considered dead if no heartbeat for this long
    session_ttl_s: float = 3600.0  # a session's last (model, replica) is forgotten after this
    memory_max_entries: int = 250_000  # MemoryPrefixIndex cap on (block, replica) entries

    @property
    def max_ttl_s(self) -> float:
        return max(self.routed_ttl_s, self.stored_ttl_s)

    @property
    def tombstone_ttl_s(self) -> float:
        """How long a removed replica stays dead (writes for it dropped) without heartbeat."""
        return self.max_ttl_s


@dataclass(frozen=True, slots=True)
class IndexStats:
    blocks: int  # (block, replica) entries not yet deleted (expired ones await lazy sweeps)
    replicas: int  # live (model, replica) pairs known to the index
    backend: str  # "memory", "redis", "resilient(redis)", "resilient(memory-fallback)"


@runtime_checkable
class PrefixIndex(Protocol):
    async def lookup(self, hashes_by_model: Mapping[str, Sequence[int]]) -> MatchInfo:
        """Longest leading match per live replica, for all candidate models at once."""
        ...

    async def record_routed(self, model: str, replica: str, hashes: Sequence[int]) -> None:
        """In-flight write: the request with these prefix hashes was sent to ``replica``."""
        ...

    async def apply_events(self, events: Sequence[CacheEvent]) -> None:
        """Ingest a batch of engine cache events, in order."""
        ...

    async def session(self, session_id: str) -> tuple[str, str] | None:
        """The (model, replica) that last served ``session_id``, if remembered."""
        ...

    async def record_session(self, session_id: str, model: str, replica: str) -> None: ...

    async def heartbeat(self, model: str, replica: str) -> None: ...

    async def live_replicas(self, model: str) -> set[str]:
        """Replicas known to the index (heartbeated or holding entries) and not dead."""
        ...

    async def remove_replica(self, model: str, replica: str) -> None:
        """Tombstone ``replica`` and purge all its entries; it is never returned again
        unless it heartbeats again."""
        ...

    async def purge_dead(self) -> int:
        """Tombstone and purge replicas whose heartbeat expired; returns how many."""
        ...

    async def stats(self) -> IndexStats: ...

    async def close(self) -> None: ...
