"""vLLM block events → canonical events (``BlockMapper``, described in
``workers.engines.vllm.engine``),
and vLLM's KV event ``medium`` mapped onto kvroute tiers, one ``BlockMapper`` per tier.

vLLM tags each ``BlockStored`` / ``BlockRemoved`` with the medium holding the blocks:
``None`` or ``"GPU"`` from the GPU block pool, ``"CPU"`` (and ``"STORAGE"``) from its KV
offloading (``--kv-offloading-backend native``: ``vllm.v1.kv_offload``, whose events
``OffloadingEventsTracker`` translates), lower-case names from some connectors (Mooncake
store: ``"cpu"``; LMCache passes its own). They map to kvroute's ``device``, ``host`` and
``disk`` tiers; a medium we do not know is ignored (never claimed). Each tier keeps its own
chain map, since a block lives and dies per tier (an offloaded copy outlives the GPU block),
but shares the device's chain states for parents it never saw (offloaded blocks are
published in any order) and one ordered event queue.
"""

from __future__ import annotations

import array
import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent, Tier
from cache_service.hashing import block_hashes, model_salt, tenant_salt

log = logging.getLogger(__name__)

VllmHash = int | bytes
_MAX_LINKS = 64
_MAX_PENDING_EVENTS = 1 << 16

@dataclass(slots=True)
class _Node:
    """The canonical chain state at the end of one vLLM block."""

    canon_parent: int | None  # canonical hash of the last full canonical block, None at start
    pending: array.array[int]  # tokens after that canonical boundary (< canonical block size)
    holders: tuple[VllmHash, ...]  # vLLM blocks holding ``pending``
    salt: int = 0  # the chain's root salt (the model's, narrowed to a tenant)
    links: list[int] = field(default_factory=list)  # canonical blocks this block is part of
    refs: int = 1


def _cache_salt(extra_keys: Sequence[Any] | None) -> str | None:
    """The ``cache_salt`` vLLM folded into a root block (the str among its extra keys:
    kvroute sends no LoRA and no multimodal input, whose keys would sit there too)."""
    keys = extra_keys[0] if extra_keys else None
    return next((k for k in keys or () if isinstance(k, str)), None)


class BlockMapper:
    """vLLM block events → canonical ``CacheEvent``s (see ``workers.engines.vllm.engine``)."""

    def __init__(self, model: str, replica: str, block_size: int, max_blocks: int = 1 << 16,
                 tier: Tier = "device", base: BlockMapper | None = None):
        """``tier``: where its blocks are; ``base`` (the device's mapper, for another tier):
        whose chain states place a parent this one has not seen, and whose event queue it
        shares (so a move's events keep their order)."""
        self._model, self._replica, self._size = model, replica, block_size
        self._salt = model_salt(model)
        self.max_blocks, self.tier, self._base = max_blocks, tier, base
        self._nodes: OrderedDict[VllmHash, _Node] = OrderedDict()
        self._events: deque[CacheEvent] = base._events if base is not None \
            else deque(maxlen=_MAX_PENDING_EVENTS)
        self.skipped_blocks = 0
        self._overflowing = False

    def stored(
        self, hashes: Sequence[VllmHash], parent: VllmHash | None,
        token_ids: Sequence[int], block_size: int, extra_keys: Sequence[Any] | None = None,
    ) -> None:
        if parent is None:
            state = _Node(None, array.array("I"), (), tenant_salt(self._salt,
                                                                  _cache_salt(extra_keys)))
        elif (found := self._nodes.get(parent)) is not None:
            self._nodes.move_to_end(parent)
            state = found
        elif self._base is not None and (found := self._base._nodes.get(parent)) is not None:
            state = found  # offloaded blocks may come without their parent: the device's
        else:
            self.skipped_blocks += len(hashes)
            return
        new: list[int] = []
        for i, h in enumerate(hashes):
            tokens = token_ids[i * block_size : (i + 1) * block_size]
            if len(tokens) != block_size:
                break
            state = self._extend(state, h, tokens, new)
        if new:
            self._emit(BlockStored(self._model, self._replica, tuple(new), self.tier))
        while len(self._nodes) > self.max_blocks:  # LRU bound, after linking
            _, dropped = self._nodes.popitem(last=False)
            if dropped.links:
                self._emit(BlockRemoved(self._model, self._replica, tuple(dropped.links),
                                        self.tier))

    def _extend(
        self, prev: _Node, h: VllmHash, tokens: Sequence[int], new: list[int]
    ) -> _Node:
        pending = prev.pending + array.array("I", tokens)
        full = len(pending) // self._size
        canon = block_hashes(pending, self._size, prev.salt, prev.canon_parent) if full else []
        if canon:
            parent, pending = canon[-1], pending[full * self._size :]
            holders: tuple[VllmHash, ...] = (h,) if pending else ()
        else:
            parent, holders = prev.canon_parent, (*prev.holders, h)
        node = self._nodes.get(h)
        if node is None:
            node = self._nodes[h] = _Node(parent, pending, holders, prev.salt)
        else:
            node.refs += 1
            self._nodes.move_to_end(h)
        if canon:
            for older in prev.holders:  # earlier tokens only reach the first canonical block
                self._link(older, canon[:1])
            self._link(h, canon)
            new.extend(canon)
        return node

    def _link(self, h: VllmHash, canon: list[int]) -> None:
        if (node := self._nodes.get(h)) is None:
            return
        for c in canon:
            if c not in node.links:
                node.links.append(c)
        del node.links[:-_MAX_LINKS]

    def removed(self, hashes: Sequence[VllmHash]) -> None:
        gone: dict[int, None] = {}
        for h in hashes:
            node = self._nodes.get(h)
            if node is None:
                continue
            node.refs -= 1
            if node.refs <= 0:
                del self._nodes[h]
                gone.update(dict.fromkeys(node.links))
        if gone:
            self._emit(BlockRemoved(self._model, self._replica, tuple(gone), self.tier))

    def cleared(self) -> None:
        self._nodes.clear()
        if self._base is None:  # one AllBlocksCleared covers every tier
            self._emit(AllBlocksCleared(self._model, self._replica))

    def drain(self) -> list[CacheEvent]:
        out = list(self._events)
        self._events.clear()
        self._overflowing = False
        return out

    def _emit(self, event: CacheEvent) -> None:
        if len(self._events) == self._events.maxlen and not self._overflowing:
            self._overflowing = True
            log.warning("vllm cache events not drained: dropping the oldest")
        self._events.append(event)


_MEDIA: dict[str, Tier] = {"gpu": "device", "cpu": "host", "storage": "disk", "disk": "disk"}


def tier_of(medium: str | None) -> Tier | None:
    """kvroute's tier for a vLLM event medium; None: unknown, ignore the event."""
    return "device" if medium is None else _MEDIA.get(medium.lower())


class TieredMapper:
    """vLLM events of every medium → canonical events with their tier."""

    def __init__(self, model: str, replica: str, block_size: int) -> None:
        self.device = BlockMapper(model, replica, block_size)
        self.tiers: dict[Tier, BlockMapper] = {"device": self.device}
        for tier in ("host", "disk"):
            self.tiers[tier] = BlockMapper(model, replica, block_size, tier=tier,
                                           base=self.device)

    def set_max_blocks(self, n: int) -> None:
        for m in self.tiers.values():
            m.max_blocks = max(n, m.max_blocks)

    def apply(self, event: Any) -> None:
        """One decoded vLLM event (``vllm.distributed.kv_events``)."""
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            self.cleared()
            return
        tier = tier_of(event.medium)
        if tier is None or event.group_idx not in (None, 0):
            return
        mapper = self.tiers[tier]
        if kind == "BlockRemoved":
            mapper.removed(event.block_hashes)
        elif kind == "BlockStored" and event.lora_id is None and event.lora_name is None:
            mapper.stored(event.block_hashes, event.parent_block_hash, event.token_ids,
                          event.block_size, getattr(event, "extra_keys", None))

    def removed(self, hashes: Sequence[int]) -> None:
        self.device.removed(hashes)

    def cleared(self) -> None:
        for m in self.tiers.values():
            m.cleared()

    def drain(self) -> list[CacheEvent]:
        return self.device.drain()
