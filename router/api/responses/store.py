"""Stored responses for the Responses API's ``store: true`` + ``previous_response_id``.

A stored response is the whole conversation up to and including its output, as the
chat template's messages (no system prompt: ``instructions`` are not carried over,
as OpenAI documents), plus the model. Each entry is a full copy, zlib-compressed JSON:
a lookup is one GET, and an entry never depends on an older one that expired first.

With a Redis URL entries live in Redis (``{ns}:resp:<id>``, PX ``ttl_s``), so any
router replica can continue any response; every entry is also kept in a bounded
local LRU, which serves reads while Redis is unreachable. Without Redis only the
local LRU exists (one router replica: fine; several: a continuation may land on a
replica that never saw the response, and gets the 404 an expired id gets).
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The conversation (``router.api.responses.normalize.Conversation``'s fields) and model."""

    model: str
    messages: list[dict[str, Any]]
    listed_tools: list[dict[str, Any]]
    loaded_tools: list[dict[str, Any]]

    def encode(self) -> bytes:
        body = json.dumps({"model": self.model, "messages": self.messages,
                           "listed_tools": self.listed_tools,
                           "loaded_tools": self.loaded_tools},
                          separators=(",", ":"), ensure_ascii=False)
        return zlib.compress(body.encode(), 1)

    @classmethod
    def decode(cls, blob: bytes) -> StoredResponse:
        data = json.loads(zlib.decompress(blob))
        return cls(str(data["model"]), list(data["messages"]), list(data["listed_tools"]),
                   list(data["loaded_tools"]))


class ResponseStore:
    def __init__(self, client: aioredis.Redis | None, namespace: str, ttl_s: float,
                 max_entry_bytes: int, memory_bytes: int) -> None:
        self.client, self.ttl_s = client, ttl_s
        self.max_entry_bytes, self.memory_bytes = max_entry_bytes, memory_bytes
        self._prefix = "{" + namespace + "}:resp:"
        self._local: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._local_bytes = 0

    @classmethod
    def from_url(cls, redis_url: str | None, namespace: str, ttl_s: float,
                 max_entry_bytes: int, memory_bytes: int) -> ResponseStore:
        client = None
        if redis_url:  # a stored conversation can be MiBs: a timeout for that, not 50 ms
            client = aioredis.Redis.from_url(redis_url, socket_timeout=1.0,
                                             socket_connect_timeout=1.0,
                                             retry=Retry(NoBackoff(), 0),
                                             health_check_interval=0)
        return cls(client, namespace, ttl_s, max_entry_bytes, memory_bytes)

    async def put(self, rid: str, stored: StoredResponse) -> bool:
        """Keep ``stored`` under ``rid``; False if it is over the size bound (not kept)."""
        blob = stored.encode()
        if len(blob) > self.max_entry_bytes:
            log.warning("response %s not stored: %d bytes > %d", rid, len(blob),
                        self.max_entry_bytes)
            return False
        self._remember(rid, blob)
        if self.client is not None:
            try:
                await self.client.set(self._prefix + rid, blob, px=int(self.ttl_s * 1000))
            except Exception as e:  # the local copy still serves this router replica
                log.warning("response store: Redis SET failed: %r", e)
        return True

    async def get(self, rid: str) -> StoredResponse | None:
        blob = None
        if self.client is not None:
            try:
                blob = await self.client.get(self._prefix + rid)
            except Exception as e:
                log.warning("response store: Redis GET failed: %r", e)
        if blob is None:
            blob = self._recall(rid)
        return StoredResponse.decode(blob) if blob is not None else None

    def _remember(self, rid: str, blob: bytes) -> None:
        if rid in self._local:
            self._local_bytes -= len(self._local.pop(rid)[1])
        self._local[rid] = (time.monotonic() + self.ttl_s, blob)
        self._local_bytes += len(blob)
        while self._local_bytes > self.memory_bytes and self._local:
            self._local_bytes -= len(self._local.popitem(last=False)[1][1])

    def _recall(self, rid: str) -> bytes | None:
        entry = self._local.get(rid)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._local_bytes -= len(self._local.pop(rid)[1])
            return None
        self._local.move_to_end(rid)
        return entry[1]

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
