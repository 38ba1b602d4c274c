"""KV blocks of the ``sim`` engine EMULATOR: a device tier, a host tier, and leases.

* Device: ``kv_blocks`` (C1) blocks. Blocks a running request uses are pinned; the others
  are evictable, LRU first (a released prompt's deepest block goes first, so shared
  prefixes outlive their tails).
* Leases: a finished request may ask to keep its blocks until a deadline (``lease_s``, the
  router's guess of the session's next turn). Leased blocks are evicted only when no
  unleased evictable block is left; an expired lease is an ordinary block again. Leases never
  hold more than ``lease_fraction`` of C1: when they are full, a new lease covers only the
  prompt's leading blocks that still fit (none if none do). Refusing, rather than pushing
  out the oldest lease, keeps a stable subset of sessions warm when the sessions' working
  set exceeds the cache: rotating leases would thrash exactly like LRU does.
* Host: ``host_kv_blocks`` (C2, 0 = none). A block evicted from the device moves to host
  (LRU; the host's own LRU block is dropped when full). A request whose leading run reaches
  host blocks reloads them onto the device, at ``host_reload_tok_s`` (the caller charges
  the time); tiers are exclusive, as blocks move.

Events are exact per tier (``cache_service.events``): a move to host is
``BlockStored(host)`` then ``BlockRemoved(device)``; a reload is ``BlockStored(device)`` then
``BlockRemoved(host)``; a host drop is ``BlockRemoved(host)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent


@dataclass(slots=True)
class LeaseCounts:
    """What became of leased blocks (cumulative): whether leases hold until the session's
    next turn, or the cap or their length lose them first."""

    granted: int = 0  # blocks leased when a request ended (a renewal counts again)
    refused: int = 0  # blocks a request would have leased that the cap left out
    hit: int = 0  # leased blocks a later request found on the device
    expired: int = 0  # leases that ran out unused (ordinary LRU blocks again)
    evicted: int = 0  # leased blocks evicted before their deadline (nothing unleased left)


class SimKv:
    """Block bookkeeping of one emulated replica (clock-free: callers pass ``now``)."""

    def __init__(self, device: int, host: int, lease_fraction: float, model: str,
                 replica: str) -> None:
        self.device, self.host_cap = device, host
        self.max_leased = int(lease_fraction * device)
        self.model, self.replica = model, replica
        self.free: OrderedDict[int, None] = OrderedDict()  # evictable, unleased, LRU first
        self.leased: OrderedDict[int, None] = OrderedDict()  # evictable, leased, oldest first
        self.deadline: dict[int, float] = {}  # lease deadline of pinned or leased blocks
        self.pinned: dict[int, int] = {}  # in use: hash -> running requests
        self.host: OrderedDict[int, None] = OrderedDict()  # host tier, LRU first
        self.reserved = 0  # device slots of blocks being prefilled or reloaded
        self.events: list[CacheEvent] = []
        self._next_expiry = float("inf")
        self.lease_counts = LeaseCounts()

    # -- queries -------------------------------------------------------------------------
    def on_device(self, h: int) -> bool:
        return h in self.pinned or h in self.free or h in self.leased

    def prefix(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(leading blocks held in any tier, how many of them are on host)."""
        n = host = 0
        for h in hashes:
            if self.on_device(h):
                pass
            elif h in self.host:
                host += 1
            else:
                break
            n += 1
        return n, host

    @property
    def cached(self) -> int:
        """Blocks on the device (in use or evictable)."""
        return len(self.free) + len(self.leased) + len(self.pinned)

    def room(self) -> int:
        return self.device - self.cached - self.reserved

    # -- a request's life ------------------------------------------------------------------
    def pin(self, h: int, owner: list[int]) -> None:
        self.free.pop(h, None)
        if h in self.leased:
            del self.leased[h]
            self.lease_counts.hit += 1
        self.pinned[h] = self.pinned.get(h, 0) + 1
        owner.append(h)

    def release(self, owned: list[int], lease_until: float, now: float,
                mine: Collection[int] = ()) -> None:
        """Unpin a request's blocks; those no other request uses become evictable, deepest
        first. Leased until ``lease_until`` (a block keeps the latest of its leases) while
        leases have room, leading blocks first: the blocks this request computed (``mine``)
        and those already leased. Blocks it found cached unleased (a prefix other sessions
        share, hot anyway) are not leased: they would fill the cap for everyone."""
        freed = []
        for h in owned:
            n = self.pinned[h] - 1
            if n:
                self.pinned[h] = n
            else:
                del self.pinned[h]
                freed.append(h)
        if now >= self._next_expiry:  # run-out leases leave the cap (no eviction may run)
            self._expire(now)
        old = {h: self.deadline.pop(h) for h in freed if h in self.deadline}
        # Leased blocks in use keep their place in the cap (``deadline`` holds them too):
        # else another session would take the room while this one runs its next turn.
        room = self.max_leased - len(self.deadline)
        leases: dict[int, float] = {}
        for h in freed:  # leading blocks first: a tail without its prefix serves nothing
            until = max(lease_until if h in mine or h in old else 0.0, old.get(h, 0.0))
            if until > now and len(leases) < room:
                leases[h] = until
            elif until > now:
                self.lease_counts.refused += 1
        self.lease_counts.granted += len(leases)
        for h in reversed(freed):
            if h in leases:
                self.leased[h] = None
                self.deadline[h] = leases[h]
                self._next_expiry = min(self._next_expiry, leases[h])
            else:
                self.free[h] = None

    def make_room(self, n: int, now: float) -> None:
        """Evict until ``n`` more blocks fit (or nothing evictable is left)."""
        need = n - self.room()
        if need <= 0:
            return
        if now >= self._next_expiry:
            self._expire(now)
        victims = []
        while need > 0 and (self.free or self.leased):
            pool = self.free if self.free else self.leased
            h, _ = pool.popitem(last=False)
            if self.deadline.pop(h, None) is not None:
                self.lease_counts.evicted += 1
            victims.append(h)
            need -= 1
        self._demote(victims)

    def store(self, hashes: Sequence[int], owner: list[int], reloaded: Iterable[int]) -> None:
        """Prefill (or reload) done: the reserved blocks are on the device, pinned."""
        for h in hashes:
            self.pin(h, owner)
        if hashes:
            self.events.append(BlockStored(self.model, self.replica, tuple(hashes)))
        if back := tuple(reloaded):
            self.events.append(BlockRemoved(self.model, self.replica, back, tier="host"))

    def take_from_host(self, hashes: Iterable[int]) -> None:
        """Blocks being reloaded leave the host tier (their event comes with ``store``)."""
        for h in hashes:
            self.host.pop(h, None)

    def clear(self) -> None:
        """Drop every evictable block and the host tier; blocks in use are re-announced."""
        self.free.clear()
        self.leased.clear()
        self.host.clear()
        self.deadline = {h: t for h, t in self.deadline.items() if h in self.pinned}
        self.events.append(AllBlocksCleared(self.model, self.replica))
        if self.pinned:
            self.events.append(BlockStored(self.model, self.replica, tuple(self.pinned)))

    # -- internals -----------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        """Expired leases become the least recently used unleased blocks."""
        gone = [h for h in self.leased if self.deadline.get(h, 0.0) <= now]
        self.lease_counts.expired += len(gone)
        for h in reversed(gone):
            del self.leased[h]
            self.deadline.pop(h, None)
            self.free[h] = None
            self.free.move_to_end(h, last=False)
        self._next_expiry = min((self.deadline[h] for h in self.leased), default=float("inf"))

    def _demote(self, victims: list[int]) -> None:
        """Evicted device blocks go to host (dropping the host's LRU blocks when full)."""
        if not victims:
            return
        if self.host_cap <= 0:
            self.events.append(BlockRemoved(self.model, self.replica, tuple(victims)))
            return
        for h in victims:
            self.host[h] = None
            self.host.move_to_end(h)
        dropped = []
        while len(self.host) > self.host_cap:
            dropped.append(self.host.popitem(last=False)[0])
        moved = set(victims)
        kept = tuple(h for h in victims if h in self.host)
        lost = tuple(h for h in dropped if h not in moved)  # announced on host before
        if kept:
            self.events.append(BlockStored(self.model, self.replica, kept, tier="host"))
        self.events.append(BlockRemoved(self.model, self.replica, tuple(victims)))
        if lost:
            self.events.append(BlockRemoved(self.model, self.replica, lost, tier="host"))
