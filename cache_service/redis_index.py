"""Shared prefix index in Redis (>= 7.0), one view for all router replicas.

Key layout (``ns`` = settings.namespace; ``{ns}`` is a hash tag, so every key of a namespace is
in ONE cluster slot and a script may touch any of them; ``tag`` = first 8 hex digits of
xxh3_64(model), mapped back to the model name in ``{ns}:m``)::

    {ns}:r:<tag>:<replica>  HASH  block hash (8 bytes, big-endian) -> expiry ms  = the index
    {ns}:p:<tag>            ZSET  replica -> max expiry of its entries (who holds anything)
    {ns}:c:<tag>            HASH  replica -> HSCAN cursor of its incremental expiry sweep
    {ns}:h:<tag>            ZSET  replica -> last heartbeat (ms)               liveness
    {ns}:d:<tag>            ZSET  replica -> tombstone time (removed / dead replicas)
    {ns}:t:<tag>            SET   replicas that stored a block in a slower tier (host, disk)
    {ns}:m                  HASH  tag -> model name (for purge_dead / stats)
    {ns}:s:<digest>         STRING "model\nreplica" of a session (xxh3_128 of its id), PX ttl

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

Lookup is ONE ``EVALSHA`` whatever the prompt length and the number of models. For each model
and each replica holding unexpired entries and not dead, the script finds the replica's match
(``redis_scripts._LONGEST``):

1. ``HGET`` block 0: a replica without it (most of them, usually) costs this one probe;
2. one ``HMGET`` of blocks 1..7 (``EXACT_BLOCKS = 8``): exact, stops at the first hole;
3. binary search over blocks 8..n-1 with single-field ``HGET`` probes: ``log2(n - 7)``
   probes (9 for a 32k-token prompt of 512 blocks) instead of one field per matched block.

Step 3 assumes the replica's holdings are *prefix-closed*: holding block ``i`` implies holding
blocks ``< i``. That is the normal state of a chained prefix cache (an engine can only reuse a
block whose whole prefix it has; vLLM evicts the leaf blocks of a chain first, and every routed
write covers a prefix from block 0). A hole past the first 8 blocks (a lost or out-of-order
``BlockRemoved``, or an older middle block whose expiry ran out before its descendants') may be
jumped over: the result is then *some* block ``m`` with ``m - 1`` held and ``m`` missing, never
less than the exact leading run. Routing may then prefer that replica more than it deserves;
the engine simply recomputes the missing blocks. Holes in the first 8 blocks (512 tokens at
block size 64) are seen exactly, as by ``MemoryPrefixIndex`` (which walks every block): the
parity suite keeps its hole cases within them.

Measured (``ops/bench/index.py``, docs/prefix-index.md): the previous linear walk read one field per
matched (block, replica): 1.2 ms inside Redis for 16 replicas matching 32..512 blocks of one
prompt, 0.7 ms on average over the bench mix (0.12 ms now). A matching replica now costs 1 + 7
+ ~9 field reads, ~1 us each in a big HASH (cache misses); galloping (probes 1, 2, 4, ... past
the head, then binary search) needs ~2 log2(match) probes and measured 1.2-1.4x slower on
random depths; dropping the exact head (``EXACT_BLOCKS = 1``) would save ~30% on replicas that
match.

The reply is one JSON string built by ``cjson`` (per model ``{replica: matched}``): redis-py's
pure-Python RESP parser spends 2-4 us per element of a multi-bulk reply (16 replicas: 33
elements), json.loads ~2 us in all. Hashes go as one binary blob per model (8 bytes each,
sliced lazily in Lua; Redis' Lua hashes every byte of a string argument, ~1 us per KB):
encoding 512 separate arguments costs more than the script itself. (A HASH rather than a ZSET
because ``ZMSCORE`` formats doubles: ~3x slower per probe, and ~50% more memory.) Writes
(``record_routed``, a batch of events) are one script call too.

Memory: 72-92 bytes per (block, replica) entry once a replica's HASH exceeds 128 entries
(hashtable encoding; INFO used_memory, ``ops/bench/index.py``), ~71 MiB per million entries at
16 replicas x 6k entries; see docs/prefix-index.md.

Every command runs with ``socket_timeout = socket_connect_timeout = timeout_s`` and no
retries; failures raise (``ResilientIndex`` turns them into a local fallback). redis-py's
``AsyncScript`` reloads a script on NOSCRIPT (e.g. after a Redis restart).
"""

from __future__ import annotations

import array
import json
import re
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
import xxhash
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import redis_scripts as lua
from .events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent, tier_bit
from .index import IndexSettings, IndexStats, Match, MatchInfo
from .redis_conn import async_client

__all__ = ["RedisPrefixIndex"]

_MAX_HASHES_PER_CALL = 16_384  # bigger write batches are split so one script stays short
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_NATIVE_U64 = array.array("Q").itemsize == 8

Op = tuple[str, str, str, int, Sequence[int], int]  # kind, model, replica, ttl_ms, hashes, tier


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


def _blob(hashes: Sequence[int]) -> bytes:
    """Hashes as 8-byte big-endian fields, concatenated (split again inside Lua)."""
    if _NATIVE_U64:  # array + byteswap: ~1.5x faster than struct.pack(">512Q", *hashes)
        packed = array.array("Q", hashes)
        if sys.byteorder == "little":
            packed.byteswap()
        return packed.tobytes()
    return struct.pack(f">{len(hashes)}Q", *hashes)  # pragma: no cover - exotic platforms


def _split(ops: Sequence[Op]) -> list[Op]:
    """Cut ops with more than ``_MAX_HASHES_PER_CALL`` hashes into consecutive pieces."""
    out: list[Op] = []
    step = _MAX_HASHES_PER_CALL
    for kind, model, replica, ttl_ms, hashes, tier in ops:
        if len(hashes) <= step:
            out.append((kind, model, replica, ttl_ms, hashes, tier))
        else:
            out += [
                (kind, model, replica, ttl_ms, hashes[i : i + step], tier)
                for i in range(0, len(hashes), step)
            ]
    return out


def _match(value: int | list[int]) -> Match:
    """A replica's reply: matched blocks, or [matched, of which not on the device]."""
    return Match(value) if isinstance(value, int) else Match(value[0], value[1])


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
        self.client: aioredis.Redis = async_client(
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
        """r: holdings (needs replica), p: holders, c: cursors, h: heartbeats, d: tombstones,
        t: replicas with slower-tier blocks."""
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
            keys += [*self._model_keys(model), self.key("t", model)]
            args += [self.key("r", model) + ":", _blob(hashes_by_model[model])]
        replies: list[dict[str, Any]] = json.loads(await self._lookup(keys=keys, args=args))
        return {m: {r: _match(v) for r, v in found.items()}
                for m, found in zip(models, replies, strict=True)}

    # ---- sessions -------------------------------------------------------------------------

    def session_key(self, session_id: str) -> str:
        # A digest: session ids may be user identities (Anthropic metadata.user_id).
        return f"{self.prefix}s:{xxhash.xxh3_128_hexdigest(session_id.encode())}"

    async def session(self, session_id: str) -> tuple[str, str] | None:
        value = await self.client.get(self.session_key(session_id))
        if not value or "\n" not in value:
            return None
        model, replica = value.split("\n", 1)
        return model, replica

    async def record_session(self, session_id: str, model: str, replica: str) -> None:
        await self.client.set(self.session_key(session_id), f"{model}\n{replica}",
                              px=_ms(self.settings.session_ttl_s))

    # ---- writes ---------------------------------------------------------------------------

    async def record_routed(self, model: str, replica: str, hashes: Sequence[int]) -> None:
        if hashes:
            await self._write([("S", model, replica, _ms(self.settings.routed_ttl_s), hashes, 1)])

    async def apply_events(self, events: Sequence[CacheEvent]) -> None:
        stored_ms = _ms(self.settings.stored_ttl_s)
        ops: list[Op] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                ops.append(("S", ev.model, ev.replica, stored_ms, ev.hashes, tier_bit(ev.tier)))
            elif isinstance(ev, BlockRemoved):
                ops.append(("D", ev.model, ev.replica, 0, ev.hashes, tier_bit(ev.tier)))
            elif isinstance(ev, AllBlocksCleared):
                ops.append(("C", ev.model, ev.replica, 0, (), 1))
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
        for kind, model, replica, ttl_ms, hashes, tier in ops:
            keys += [self.key("d", model), self.key("r", model, replica)]
            keys += [self.key("p", model), self.key("c", model), self.key("t", model)]
            args += [kind, self.tag(model), model, replica, ttl_ms, _blob(hashes), tier]
        await self._write_script(keys=keys, args=args)

    # ---- liveness -------------------------------------------------------------------------

    async def _liveness_call(self, op: str, model: str, replica: str) -> None:
        keys = [self._models_key, *self._model_keys(model), self.key("c", model)]
        keys += [self.key("r", model, replica), self.key("t", model)]
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
        keys = [k for m in models
                for k in (*self._model_keys(m), self.key("c", m), self.key("t", m))]
        args = [self._live_ms, self._tomb_ms, *(self.key("r", m) + ":" for m in models)]
        return int(await self._purge_dead(keys=keys, args=args))

    async def stats(self) -> IndexStats:
        blocks = replicas = 0
        for model in await self._models():
            live, entries = await self._live_and_count(model)
            replicas += len(live)
            blocks += entries
        return IndexStats(blocks=blocks, replicas=replicas, backend="redis")

    async def held_blocks(self, model: str, replica: str) -> set[int]:
        """The block hashes ``replica`` holds unexpired (a full read of its HASH: for
        measurements such as what a scale-down loses, never on the routing path)."""
        key = self.key("r", model, replica)
        raw = await self.client.execute_command("HGETALL", key, NEVER_DECODE=True)
        secs, micros = await self.client.time()
        now_ms = secs * 1000 + micros // 1000
        pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
        return {struct.unpack(">Q", f)[0] for f, exp in pairs if int(exp) > now_ms}

    async def close(self) -> None:
        await self.client.aclose()
