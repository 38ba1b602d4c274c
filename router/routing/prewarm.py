"""Pre-warmed scale-out: a replica Serve adds gets the hottest shared prefixes first.

A new replica starts with an empty KV cache, so its first requests pay full prefills of
prompts every other replica already holds (system prompts, tool definitions). When this
router sees a replica of a model appear in Serve's view (``router.routing.views``, pushed by
Serve's controller), it sends that replica the hottest prefixes as prefill-only requests
(``max_tokens`` 1: every engine supports it, no protocol change), one at a time, at most
``max_prefixes`` / ``max_tokens`` of them and within ``timeout_s``. Meanwhile this router
keeps user traffic off the replica (at most ``hold_s``), so a user's first request there
finds the prefix cached. A warm-up that fails or times out is dropped: it never fails or
delays a user request (it runs in its own task; the hold ends with it).

Which prefixes: the index holds block hashes, not token ids, so each router replica keeps
the ids itself (``HotPrefixes``), recorded on the routing path where it has both the ids
and the index's per-replica match: a request whose prefix some replicas already hold
reuses that prefix; the table counts those reuses per prefix (keyed by its last block's
hash) with the number of replicas holding it. Hot = reused by ``min_uses`` requests;
ranked by holders, then uses. Not the prompt caches (``router.prompt.cache`` and its Redis
level): they key rendered-text segments, not block-aligned token prefixes, see only chat
requests, and say nothing of how many requests or replicas share a segment. The table is
bounded (``table_size`` prefixes, LRU).

Who warms: with a shared Redis index, the router replica that wins ``SET NX`` on
``{namespace}:warm:<model>:<replica>`` (a replica id is never reused, so the key only
bounds the memory with its TTL); Redis down = no warm-up. With the embedded index each
router replica has its own index and warms on its own. A router replica's first view of a
model is its baseline: replicas already there when it started are not new.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from cache_service.redis_conn import async_client
from deploy.config.router import PrewarmConfig
from router import metrics
from router.routing.views import RANK_KWARG, ReplicaInfo
from workers.protocol import Final, SamplingParams, WorkRequest, token_array

log = logging.getLogger(__name__)

CLAIM_TTL_S = 600.0
_DEPTHS = 3  # distinct match depths recorded per request (the most-held first)

# model, replica, the warm-up request, its block hashes -> True if that replica did it
Send = Callable[[str, str, WorkRequest, Sequence[int]], Awaitable[bool]]


@dataclass(slots=True)
class HotPrefix:
    model: str
    tenant: str | None
    ids: array  # token ids of whole blocks ("I": 4 bytes each, compact next to a list)
    hashes: tuple[int, ...]
    uses: int = 0
    holders: int = 0


class HotPrefixes:
    """Token ids of prefixes that requests reused, per (model, tenant, last block hash)."""

    def __init__(self, size: int, block_size: int) -> None:
        self.size, self.block_size = size, block_size
        self._table: OrderedDict[tuple[str, str | None, int], HotPrefix] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def observe(self, model: str, tenant: str | None, token_ids: Sequence[int],
                hashes: Sequence[int], matches: Mapping[str, int]) -> None:
        """A request of ``model`` with these ids and block hashes; ``matches``: the index's
        leading blocks per replica."""
        depths = sorted((int(v) for v in matches.values() if v > 0), reverse=True)
        if not depths:
            return
        holders = {d: n for n, d in enumerate(depths, 1)}  # replicas holding >= d blocks
        for d in sorted(holders)[:_DEPTHS]:
            d = min(d, len(hashes))
            key = (model, tenant, hashes[d - 1])
            entry = self._table.get(key)
            if entry is None:
                entry = self._table[key] = HotPrefix(
                    model, tenant, token_array(token_ids, d * self.block_size),
                    tuple(hashes[:d]))
                while len(self._table) > self.size:
                    self._table.popitem(last=False)
            else:
                self._table.move_to_end(key)
            entry.uses += 1
            entry.holders = max(holders[d], 1)

    def plan(self, model: str, config: PrewarmConfig) -> list[HotPrefix]:
        """The prefixes to send a new replica of ``model``: hot ones, most held first,
        none inside one already chosen, within the count and token bounds."""
        hot = [e for e in self._table.values() if e.model == model and e.uses >= config.min_uses]
        hot.sort(key=lambda e: (e.holders, e.uses, len(e.hashes)), reverse=True)
        chosen: list[HotPrefix] = []
        covered: set[tuple[str | None, int]] = set()
        tokens = 0
        for e in hot:
            if (e.tenant, e.hashes[-1]) in covered:
                continue  # warmed by a longer one already chosen
            mine = set(e.hashes)
            inside = [c for c in chosen if c.tenant == e.tenant and c.hashes[-1] in mine]
            cost = len(e.ids) - sum(len(c.ids) for c in inside)
            if tokens + cost > config.max_tokens:
                continue
            chosen = [c for c in chosen if c not in inside] + [e]  # e warms those too
            covered |= {(e.tenant, h) for h in e.hashes}
            tokens += cost
            if len(chosen) == config.max_prefixes:
                break
        return chosen


class Prewarmer:
    """Finds new replicas in each view, warms them in background tasks, holds traffic."""

    def __init__(self, config: PrewarmConfig, block_size: int, send: Send,
                 redis_url: str | None = None, namespace: str = "kvroute",
                 timeout_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self._send, self._clock = config, send, clock
        self.table = HotPrefixes(config.table_size, block_size)
        self._seen: dict[str, frozenset[str]] = {}
        self._held: dict[tuple[str, str], float] = {}  # (model, replica) -> hold until
        self._tasks: set[asyncio.Task[Any]] = set()
        self._prefix = "{" + namespace + "}:warm:"
        self._redis = async_client(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        ) if redis_url else None
        self.counts = {"warmed": 0, "failed": 0, "lost_claim": 0}

    def observe(self, model: str, tenant: str | None, token_ids: Sequence[int],
                hashes: Sequence[int], matches: Mapping[str, int]) -> None:
        if self.config.enabled:
            self.table.observe(model, tenant, token_ids, hashes, matches)

    def admit(self, model: str, view: list[ReplicaInfo]) -> list[ReplicaInfo]:
        """``view`` without the replicas being warmed (unless that leaves none); starts
        warming replicas this router has not seen before."""
        if not self.config.enabled:
            return view
        ids = frozenset(i.replica for i in view)
        seen = self._seen.get(model)
        if seen != ids:
            self._seen[model] = ids
            if seen is not None:
                for replica in sorted(ids - seen):
                    self._start(model, replica)
        if not self._held:
            return view
        now = self._clock()
        keep = [i for i in view if self._held.get((model, i.replica), 0.0) <= now]
        return keep or view

    def warming(self) -> set[tuple[str, str]]:
        """(model, replica) pairs being warmed now."""
        return set(self._held)

    def _start(self, model: str, replica: str) -> None:
        plan = self.table.plan(model, self.config)
        if not plan:
            return
        self._held[(model, replica)] = self._clock() + self.config.hold_s
        # A context of its own: the request that happened to see the replica appear is not
        # the warm-up's (its logs, spans and Serve request id would name that request).
        task = asyncio.get_running_loop().create_task(self._warm(model, replica, plan),
                                                      context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, model: str, replica: str, plan: list[HotPrefix]) -> None:
        sent = 0
        try:
            async with asyncio.timeout(self.config.timeout_s):
                if not await self._claim(model, replica):
                    self.counts["lost_claim"] += 1
                    return
                for p in plan:
                    work = WorkRequest(f"prewarm-{uuid.uuid4().hex[:12]}", p.ids.tolist(),
                                       SamplingParams(max_tokens=1), cache_salt=p.tenant,
                                       background=True)
                    if not await self._send(model, replica, work, p.hashes):
                        break
                    sent += 1
        except Exception as e:  # noqa: BLE001 - a warm-up never matters to a user request
            log.warning("pre-warm of %s/%s stopped after %d of %d: %r", model, replica, sent,
                        len(plan), e)
        finally:
            self._held.pop((model, replica), None)
            self.counts["warmed"] += sent
            self.counts["failed"] += len(plan) - sent
            metrics.PREWARM.labels(model, "ok").inc(sent)
            metrics.PREWARM.labels(model, "failed").inc(len(plan) - sent)
        log.info("pre-warmed %s/%s with %d of %d hot prefixes", model, replica, sent, len(plan))

    async def _claim(self, model: str, replica: str) -> bool:
        """True if this router replica is the one to warm ``replica``."""
        if self._redis is None:
            return True
        try:
            return bool(await self._redis.set(f"{self._prefix}{model}:{replica}", "1", nx=True,
                                              px=int(CLAIM_TTL_S * 1000)))
        except (RedisError, OSError) as e:
            log.warning("pre-warm claim failed, not warming %s/%s: %r", model, replica, e)
            return False

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._redis is not None:
            await self._redis.aclose()


def serve_sender(handles: Mapping[str, Any], on_final: Callable[[str, Final], None],
                 record_routed: Callable[[str, str, list[int]], None]) -> Send:
    """A ``Send`` over the router's streaming handles: the warm-up goes to ``replica``
    only if Serve's request router can put it there (else it is dropped on the replica
    that took it); its blocks count in the index as a routed request's do."""

    async def send(model: str, replica: str, work: WorkRequest, hashes: Sequence[int]) -> bool:
        stream = handles[model].generate.remote(work, **{RANK_KWARG: [replica]})
        ended = False
        try:
            async for msg in stream:
                if msg.replica != replica:
                    return False  # that replica was full or gone: Serve moved it
                if isinstance(msg, Final):
                    ended = True
                    on_final(model, msg)
                    if hashes:
                        record_routed(model, replica, list(hashes))
                    return msg.finish_reason != "abort"
            ended = True
            return False
        finally:
            if not ended:  # moved, timed out or cancelled: nothing may keep running
                stream.cancel()

    return send
