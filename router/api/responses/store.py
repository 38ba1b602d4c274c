"""Stored responses for the Responses API's ``store: true`` + ``previous_response_id``.

A stored response is the whole conversation up to and including its output, as the
chat template's messages (no system prompt: ``instructions`` are not carried over,
as OpenAI documents), plus the model and its owner. Each entry is a full copy,
zlib-compressed JSON: a lookup is one GET, and an entry never depends on an older one
that expired first.

Bounds, so no caller can make the store, or a continuation of it, grow without limit:

- ``max_entry_bytes`` bounds an entry's *raw* JSON (what a continuation decodes and then
  renders), not only its compressed size; a larger response is served, not stored.
- Past reasoning is kept once (``reasoning_content``; the template's other name for it,
  ``thinking``, is put back when the entry is read).
- The bytes one owner keeps are bounded (``key_bytes``, a quarter of ``memory_bytes`` by
  default), as are the whole store's (``memory_bytes``); in Redis the same bounds are kept
  as two counters per TTL, which may over-count (a count only ends when no entry was
  added for ``ttl_s``), never under-count.
- An entry is encoded in a thread, and decoded in one when its blob is large, so a big
  conversation never holds the event loop.

Each entry belongs to the key that stored it (its tenant when tenant isolation is on):
another key's id reads as not found, the same answer an unknown id gets.

With a Redis URL entries live in Redis (``{ns}:resp:<id>``, PX ``ttl_s``), opened with
``cache_service.redis_conn.async_client`` (Sentinel URLs too), so any router replica can
continue any response; every entry is also kept in a bounded local LRU, which serves
reads while Redis is unreachable. Without Redis only the local LRU exists (one router
replica: fine; several: a continuation may land on a replica that never saw the
response, and gets the 404 an expired id gets).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache_service.redis_conn import async_client

log = logging.getLogger(__name__)
INLINE_DECODE_BYTES = 32 << 10  # a compressed blob under this decodes on the loop (~1 ms)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The conversation (``router.api.responses.normalize.Conversation``'s fields), model
    and owner (the key's name; None without auth); ``raw_bytes``: its size as JSON."""

    model: str
    messages: list[dict[str, Any]]
    listed_tools: list[dict[str, Any]]
    loaded_tools: list[dict[str, Any]]
    owner: str | None = None
    raw_bytes: int = 0

    def encode(self) -> tuple[bytes, int]:
        """(the compressed blob, the raw JSON's size)."""
        body = json.dumps({"model": self.model, "owner": self.owner,
                           "messages": [_once(m) for m in self.messages],
                           "listed_tools": self.listed_tools,
                           "loaded_tools": self.loaded_tools},
                          separators=(",", ":"), ensure_ascii=False).encode()
        return zlib.compress(body, 1), len(body)

    @classmethod
    def decode(cls, blob: bytes) -> StoredResponse:
        raw = zlib.decompress(blob)
        data = json.loads(raw)
        return cls(str(data["model"]), [_twice(m) for m in data["messages"]],
                   list(data["listed_tools"]), list(data["loaded_tools"]), data.get("owner"),
                   len(raw))


def _once(message: dict[str, Any]) -> dict[str, Any]:
    """Past reasoning under one name (``with_past_reasoning`` sets two, the same text)."""
    if "thinking" in message and message.get("thinking") == message.get("reasoning_content"):
        return {k: v for k, v in message.items() if k != "thinking"}
    return message


def _twice(message: dict[str, Any]) -> dict[str, Any]:
    if "reasoning_content" in message and "thinking" not in message:
        message["thinking"] = message["reasoning_content"]
    return message


class ResponseStore:
    def __init__(self, client: aioredis.Redis | None, namespace: str, ttl_s: float,
                 max_entry_bytes: int, memory_bytes: int, key_bytes: int | None = None,
                 on_share: Callable[[str, int, int, int], None] | None = None) -> None:
        self.client, self.ttl_s, self.on_share = client, ttl_s, on_share
        self.max_entry_bytes, self.memory_bytes = max_entry_bytes, memory_bytes
        self.key_bytes = memory_bytes // 4 if key_bytes is None else key_bytes
        self._prefix = "{" + namespace + "}:resp:"
        self._local: OrderedDict[str, tuple[float, bytes, str]] = OrderedDict()
        self._local_bytes = 0
        self._owner_bytes: dict[str, int] = {}

    @classmethod
    def from_url(cls, redis_url: str | None, namespace: str, ttl_s: float,
                 max_entry_bytes: int, memory_bytes: int,
                 on_share: Callable[[str, int, int, int], None] | None = None
                 ) -> ResponseStore:
        """``on_share``: each owner's counted bytes in Redis, what it wrote and what it was
        refused (``router.telemetry.redis_share``)."""
        client = None
        if redis_url:  # a stored conversation can be MiBs: a timeout for that, not 50 ms
            client = async_client(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                  retry=Retry(NoBackoff(), 0), health_check_interval=0)
        return cls(client, namespace, ttl_s, max_entry_bytes, memory_bytes, on_share=on_share)

    async def put(self, rid: str, stored: StoredResponse) -> bool:
        """Keep ``stored`` under ``rid``; False if it is over a bound (not kept)."""
        blob, raw = await asyncio.to_thread(stored.encode)
        owner = stored.owner or ""
        if raw > self.max_entry_bytes or len(blob) > self.key_bytes:
            log.warning("response %s not stored: %d bytes raw > %d (or over the owner's "
                        "%d)", rid, raw, self.max_entry_bytes, self.key_bytes)
            return False
        self._remember(rid, blob, owner)
        if self.client is not None:
            try:
                if await self._charge(owner, len(blob)):
                    await self.client.set(self._prefix + rid, blob, px=int(self.ttl_s * 1000))
            except Exception as e:  # the local copy still serves this router replica
                log.warning("response store: Redis SET failed: %r", e)
        return True

    async def _charge(self, owner: str, size: int) -> bool:
        """Count ``size`` against the owner's and the store's bytes in Redis; False (and
        nothing counted) when either is over its bound."""
        assert self.client is not None
        ttl = int(self.ttl_s * 1000)
        keys = (f"{self._prefix}bytes:{owner}", f"{self._prefix}bytes")
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.incrby(key, size)
            pipe.pexpire(key, ttl)
        mine, _, total, _ = await pipe.execute()
        if int(mine) <= self.key_bytes and int(total) <= self.memory_bytes:
            self._report(owner, int(mine), size, 0)
            return True
        self._report(owner, int(mine) - size, 0, size)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.decrby(key, size)
        await pipe.execute()
        log.warning("response store: Redis bound reached (owner %d / %d, all %d / %d bytes)",
                    int(mine), self.key_bytes, int(total), self.memory_bytes)
        return False

    def _report(self, owner: str, share: int, written: int, refused: int) -> None:
        if self.on_share is not None and owner:
            self.on_share(owner, share, written, refused)

    async def get(self, rid: str, owner: str | None = None) -> StoredResponse | None:
        """The entry ``owner`` stored under ``rid``; None if unknown, expired or another's."""
        blob = None
        if self.client is not None:
            try:
                blob = await self.client.get(self._prefix + rid)
            except Exception as e:
                log.warning("response store: Redis GET failed: %r", e)
        if blob is None:
            blob = self._recall(rid)
        if blob is None:
            return None
        stored = StoredResponse.decode(blob) if len(blob) <= INLINE_DECODE_BYTES \
            else await asyncio.to_thread(StoredResponse.decode, blob)
        return stored if (stored.owner or "") == (owner or "") else None

    def _remember(self, rid: str, blob: bytes, owner: str) -> None:
        if rid in self._local:
            self._forget(rid)
        while self._local and self._owner_bytes.get(owner, 0) + len(blob) > self.key_bytes:
            self._forget(next(r for r, e in self._local.items() if e[2] == owner))
        self._local[rid] = (time.monotonic() + self.ttl_s, blob, owner)
        self._local_bytes += len(blob)
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + len(blob)
        while self._local_bytes > self.memory_bytes and self._local:
            self._forget(next(iter(self._local)))

    def _forget(self, rid: str) -> None:
        _, blob, owner = self._local.pop(rid)
        self._local_bytes -= len(blob)
        left = self._owner_bytes[owner] - len(blob)
        if left > 0:
            self._owner_bytes[owner] = left
        else:
            del self._owner_bytes[owner]

    def _recall(self, rid: str) -> bytes | None:
        entry = self._local.get(rid)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._forget(rid)
            return None
        self._local.move_to_end(rid)
        return entry[1]

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
