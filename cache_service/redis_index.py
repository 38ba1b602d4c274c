"""Shared prefix index in Redis (>= 7.0), one view for all router replicas.

Key layout (``ns`` = settings.namespace; ``{ns}`` is a hash tag, so every key of a namespace is
in ONE cluster slot and a script may touch any of them; ``tag`` = first 8 hex digits of
xxh3_64(model), mapped back to the model name in ``{ns}:m``)::

    {ns}:r:<tag>:<replica>  HASH  block hash (8 bytes, big-endian) -> expiry ms  = the index
    {ns}:p:<tag>            ZSET  replica -> max expiry of its entries (who holds anything)
    {ns}:c:<tag>            HASH  replica -> HSCAN cursor of its incremental expiry sweep
    {ns}:h:<tag>            ZSET  replica -> last heartbeat (ms)               liveness
    {ns}:d:<tag>            ZSET  replica -> tombstone time (removed / dead replicas)
    {ns}:m                  HASH  tag -> model name (for purge_dead / stats)

One HASH per (model, replica) is both the index and the per-replica reverse set: purging a
replica is one ``UNLINK``. Redis 7.0 has no per-field TTL (HEXPIRE is 7.4), so each field's
value is its expiry, compared with ``TIME`` inside the scripts; it only ever grows (a routed
write never shortens an engine-confirmed entry). Expired fields are invisible at once and
deleted lazily: every write to a replica also sweeps ``2 * new fields + 64`` fields of its
HASH from a persistent HSCAN cursor (twice as fast as it inserts, so garbage stays below the
live entries).
Every written key gets ``PEXPIRE max_ttl`` as a backstop (>= any of its fields' expiry), so
a replica that stops being written vanishes entirely. ``purge_dead`` prunes heartbeats and
tombstones.

Lookup is ONE ``EVALSHA`` whatever the prompt length and the number of models: for each model
and each replica holding unexpired entries and not dead, the script walks the chain with
``HMGET`` on chunks of 4, 16, 64, ... hashes and stops at that replica's first missing or
expired block: O(replicas x log(match)) Redis calls, O(sum of matches) field probes, and a
replica without block 0 costs one 4-field ``HMGET``. (A HASH rather than a ZSET because
``ZMSCORE`` formats doubles: ~3x slower per probe, and ~50% more memory.) Writes
(``record_routed``, a batch of events) are one script call too. Hashes are sent as one binary
blob per op: encoding 512 separate arguments costs more than the script itself.

Memory: ~70-80 bytes per (block, replica) entry (INFO memory; see
``tests/cache_service/bench_redis_index.py``), i.e. ~75 MB per million entries.

Every command runs with ``socket_timeout = socket_connect_timeout = timeout_s`` and no
retries; failures raise (``ResilientIndex`` turns them into a local fallback). redis-py's
``AsyncScript`` reloads a script on NOSCRIPT (e.g. after a Redis restart).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
import xxhash
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import redis_scripts as lua
from .events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from .index import IndexSettings, IndexStats, MatchInfo

__all__ = ["RedisPrefixIndex"]

_MAX_HASHES_PER_CALL = 16_384  # bigger write batches are split so one script stays short
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")

Op = tuple[str, str, str, int, Sequence[int]]  # kind, model, replica, ttl_ms, hashes


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


def _blob(hashes: Sequence[int]) -> bytes:
    """Hashes as 8-byte big-endian fields, concatenated (split again inside Lua)."""
    return struct.pack(f">{len(hashes)}Q", *hashes)


def _split(ops: Sequence[Op]) -> list[Op]:
    """Cut ops with more than ``_MAX_HASHES_PER_CALL`` hashes into consecutive pieces."""
    out: list[Op] = []
    step = _MAX_HASHES_PER_CALL
    for kind, model, replica, ttl_ms, hashes in ops:
        if len(hashes) <= step:
            out.append((kind, model, replica, ttl_ms, hashes))
        else:
            out += [
                (kind, model, replica, ttl_ms, hashes[i : i + step])
                for i in range(0, len(hashes), step)
            ]
    return out


class RedisPrefixIndex:
    """``PrefixIndex`` backed by Redis; safe to share between processes and hosts."""

    def __init__(
        self,
        url: str,
        settings: IndexSettings = IndexSettings(),  # noqa: B008 - frozen, immutable default
        timeout_s: float = 0.05,
    ) -> None:
        if not _NAMESPACE_RE.match(settings.namespace):
            raise ValueError(f"namespace must match {_NAMESPACE_RE.pattern}")
        self.settings = settings
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            health_check_interval=0,
        )
        self.prefix = "{" + settings.namespace + "}:"
        self._models_key = self.prefix + "m"
        self._live_ms = _ms(settings.liveness_ttl_s)
        self._tomb_ms = _ms(settings.tombstone_ttl_s)
        self._tags: dict[str, str] = {}
        self._lookup = self.client.register_script(lua.LOOKUP)
        self._write_script = self.client.register_script(lua.WRITE)
        self._liveness = self.client.register_script(lua.LIVENESS)
        self._purge_dead = self.client.register_script(lua.PURGE_DEAD)
        self._live_count = self.client.register_script(lua.LIVE_AND_COUNT)

    # ---- key names ------------------------------------------------------------------------

    def tag(self, model: str) -> str:
        tag = self._tags.get(model)
        if tag is None:
            tag = self._tags[model] = f"{xxhash.xxh3_64_intdigest(model.encode()):016x}"[:8]
        return tag

    def key(self, kind: str, model: str, replica: str | None = None) -> str:
        """r: holdings (needs replica), p: holders, c: cursors, h: heartbeats, d: tombstones."""
        base = f"{self.prefix}{kind}:{self.tag(model)}"
        return base if replica is None else f"{base}:{replica}"

    def _model_keys(self, model: str) -> list[str]:
        return [self.key("h", model), self.key("d", model), self.key("p", model)]

    # ---- lookup ---------------------------------------------------------------------------

    async def lookup(self, hashes_by_model: Mapping[str, Sequence[int]]) -> MatchInfo:
        if not hashes_by_model:
            return {}
        models = list(hashes_by_model)
        keys: list[str] = []
        args: list[Any] = [self._live_ms, self._tomb_ms]
        for model in models:
            keys += self._model_keys(model)
            args += [self.key("r", model) + ":", _blob(hashes_by_model[model])]
        raw = await self._lookup(keys=keys, args=args)
        result: MatchInfo = {}
        pos = 0
        for model in models:
            count = int(raw[pos])
            flat = raw[pos + 1 : pos + 1 + 2 * count]
            result[model] = {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}
            pos += 1 + 2 * count
        return result

    # ---- writes ---------------------------------------------------------------------------

    async def record_routed(self, model: str, replica: str, hashes: Sequence[int]) -> None:
        if hashes:
            await self._write([("S", model, replica, _ms(self.settings.routed_ttl_s), hashes)])

    async def apply_events(self, events: Sequence[CacheEvent]) -> None:
        stored_ms = _ms(self.settings.stored_ttl_s)
        ops: list[Op] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                ops.append(("S", ev.model, ev.replica, stored_ms, ev.hashes))
            elif isinstance(ev, BlockRemoved):
                ops.append(("D", ev.model, ev.replica, 0, ev.hashes))
            elif isinstance(ev, AllBlocksCleared):
                ops.append(("C", ev.model, ev.replica, 0, ()))
            else:
                raise TypeError(f"not a cache event: {ev!r}")
        await self._write(ops)

    async def _write(self, ops: Sequence[Op]) -> None:
        """Run ops in order; one script call unless the batch exceeds the per-call budget."""
        batch: list[Op] = []
        size = 0
        for op in _split(ops):
            if batch and size + len(op[4]) > _MAX_HASHES_PER_CALL:
                await self._write_call(batch)
                batch, size = [], 0
            batch.append(op)
            size += len(op[4])
        if batch:
            await self._write_call(batch)

    async def _write_call(self, ops: Sequence[Op]) -> None:
        keys: list[str] = [self._models_key]
        args: list[Any] = [_ms(self.settings.max_ttl_s)]
        for kind, model, replica, ttl_ms, hashes in ops:
            keys += [self.key("d", model), self.key("r", model, replica)]
            keys += [self.key("p", model), self.key("c", model)]
            args += [kind, self.tag(model), model, replica, ttl_ms, _blob(hashes)]
        await self._write_script(keys=keys, args=args)

    # ---- liveness -------------------------------------------------------------------------

    async def _liveness_call(self, op: str, model: str, replica: str) -> None:
        keys = [self._models_key, *self._model_keys(model), self.key("c", model)]
        keys.append(self.key("r", model, replica))
        await self._liveness(keys=keys, args=[op, self.tag(model), model, replica])

    async def heartbeat(self, model: str, replica: str) -> None:
        await self._liveness_call("beat", model, replica)

    async def remove_replica(self, model: str, replica: str) -> None:
        await self._liveness_call("kill", model, replica)

    async def live_replicas(self, model: str) -> set[str]:
        live, _ = await self._live_and_count(model)
        return live

    async def _live_and_count(self, model: str) -> tuple[set[str], int]:
        args = [self._live_ms, self._tomb_ms, self.key("r", model) + ":"]
        raw = await self._live_count(keys=self._model_keys(model), args=args)
        return set(raw[:-2]), int(raw[-1])

    async def _models(self) -> list[str]:
        by_tag: dict[str, str] = await self.client.hgetall(self._models_key)
        return list(by_tag.values())

    async def purge_dead(self) -> int:
        models = await self._models()
        if not models:
            return 0
        keys = [k for m in models for k in (*self._model_keys(m), self.key("c", m))]
        args = [self._live_ms, self._tomb_ms, *(self.key("r", m) + ":" for m in models)]
        return int(await self._purge_dead(keys=keys, args=args))

    async def stats(self) -> IndexStats:
        blocks = replicas = 0
        for model in await self._models():
            live, entries = await self._live_and_count(model)
            replicas += len(live)
            blocks += entries
        return IndexStats(blocks=blocks, replicas=replicas, backend="redis")

    async def close(self) -> None:
        await self.client.aclose()
