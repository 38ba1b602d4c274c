"""Per-key rate limits (requests/min and tokens/min), shared by every router replica.

GCRA (the generic cell rate algorithm: a token bucket kept as one timestamp)
---------------------------------------------------------------------------
A limit of ``L`` per period ``T`` (60 s) spends ``I = T * cost / L`` of time credit per
request (``cost`` = 1 for requests, the token count for tokens). Per key and limit we store one
number, the *theoretical arrival time* ``TAT``: when the bucket would be full again if nothing
else arrived. A request at ``now`` computes ``new = max(TAT, now) + I`` and is admitted iff
``new - now <= T`` (at most one period of credit outstanding), storing ``TAT = new``. That
allows a burst of ``L`` (10 rpm: 10 requests at once, the 11th refused) and ``L`` per ``T`` on
average. A refused request changes nothing and should retry after ``new - T - now``. A missing
key or ``TAT <= now`` is a full bucket, so each key expires (``PX``) when its TAT passes: idle
keys cost no memory. Integer microseconds, ``I`` rounded down: ``L`` at one instant always fit.

Redis (``BATCH_LUA``): both limits are checked in one script, atomically across all router
replicas; a request refused by either limit is charged to neither. Times come from the Redis
server (``TIME``), so router clocks need not agree. Admissions that arrive while a call is in
flight are coalesced into the next call (single flight per router: one connection, one round
trip per batch, however many requests arrive at once; a request waits at most for the call
in flight plus its own). Keys: ``{<namespace>-rl}:<key name>:req`` and ``...:tok``; the one
hash tag keeps a batch in one Redis Cluster slot. redis-py's ``AsyncScript`` reloads the script
on NOSCRIPT (e.g. after a Redis restart).

Tokens charged at admission = prompt tokens + the request's effective ``max_tokens`` (the most
it can use). ``refund(key, unused)`` gives back what a finished request did not use
(``TAT -= I(unused)``, never past a full bucket; batched like admissions, best effort). A
request needing more than a whole minute's token budget can never pass: 429
``request_exceeds_rate_limit`` (``param`` ``max_tokens``) without ``retry-after``.

Failures: Redis calls have a ``timeout_s`` (50 ms) socket timeout, no retries, and an
``op_timeout_s`` hard cap. A failure opens a circuit for ``backoff_s``; meanwhile an in-process
GCRA (``LocalGcra``, same arithmetic) decides at once, so limits become **per router replica**
(N replicas admit up to N times a key's limit) and a dead Redis costs at most one timeout per
``backoff_s``, never one per request. Then one probe request tries Redis (others stay local)
and closes the circuit if it answers. While Redis is healthy each admission is mirrored into
the local GCRA, so a failover starts from this replica's recent usage, not a full bucket.
Without a Redis URL the limiter is local only.

URLs: ``redis://[[user]:password@]host:port/db`` (AUTH, ACL users), ``rediss://`` (TLS; query
parameters such as ``ssl_ca_certs=/path/ca.pem``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` go to redis-py), ``unix:///path.sock``. URLs (they may hold a password),
keys and digests are never logged; errors name keys by ``name`` only.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache_service.breaker import CircuitBreaker
from cache_service.redis_conn import async_client
from deploy.config.auth import RateLimitStoreConfig
from router.auth.keys import ApiKeyConfig
from router.errors import ApiError

__all__ = ["BATCH_LUA", "LocalGcra", "RateLimiter", "store_url"]

log = logging.getLogger(__name__)
PERIOD_S = 60.0
REQUESTS, TOKENS = 1, 2  # bits of "which limit refused"
MAX_BATCH = 256
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_Step = tuple[tuple[str, int], int, int]  # (key name, kind), new TAT us, wait us
Entry = tuple[str, str, int, int, int]  # op ('a' | 'r'), key name, rpm, tpm, tokens
Reply = tuple[int, int, int]  # admitted, wait us, which


BATCH_LUA = """
-- A batch of entries, in order. Entry i: KEYS[2i-1], KEYS[2i] = its request and token TATs
-- (us, Redis clock); ARGV[1] = period_us, ARGV[4i-2 .. 4i+1] = op ('a' admit, 'r' refund),
-- rpm, tpm, tokens (a limit <= 0 is not checked). Replies {admitted, wait_us, which} per entry
-- (which: 1 requests, 2 tokens, 3 both refused); a refund replies {1, 0, 0}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = tonumber(ARGV[1])
local function tat_of(key)
  local tat = tonumber(redis.call('GET', key) or 0)
  if tat < now then return now end
  return tat
end
local function store(key, new)  -- a TAT not after now is a full bucket: no key at all
  if new > now then
    redis.call('SET', key, string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000))
  else
    redis.call('DEL', key)
  end
end
local function step(key, limit, cost)
  if limit <= 0 then return nil, -period end
  local new = tat_of(key) + math.floor(period * cost / limit)
  return new, new - period - now
end
local out = {}
for i = 1, #KEYS / 2 do
  local rk, tk, a = KEYS[2 * i - 1], KEYS[2 * i], 4 * i - 2
  local rpm, tpm, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local ok, wait, which = 1, 0, 0
  if ARGV[a] == 'r' then
    if tpm > 0 then store(tk, tat_of(tk) - math.floor(period * cost / tpm)) end
  else
    local rn, rw = step(rk, rpm, 1)
    local tn, tw = step(tk, tpm, cost)
    if rw > 0 then which = which + 1 end
    if tw > 0 then which = which + 2 end
    if which > 0 then
      ok, wait = 0, math.max(rw, tw)
    else
      if rn then store(rk, rn) end
      if tn then store(tk, tn) end
    end
  end
  out[#out + 1] = ok
  out[#out + 1] = wait
  out[#out + 1] = which
end
return out
"""


def store_url(store: RateLimitStoreConfig, index_url: str | None) -> str | None:
    """The limiter's Redis: its own store if configured, else the index's (warned: that one
    evicts, and an evicted limit key is a full bucket)."""
    if store.configured:
        return store.url()
    if index_url:
        log.warning("rate limits share the index's Redis, whose eviction can reset them; "
                    "set auth.rate_limit_store to a noeviction Redis (docs/auth.md)")
    return index_url


def _interval_us(period_us: int, cost: int, limit: int) -> int:
    return period_us * cost // limit


class LocalGcra:
    """The same GCRA in process memory (one router replica's view); ``clock`` in seconds."""

    def __init__(
        self, period_s: float = PERIOD_S, clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self.period_us = int(period_s * 1_000_000)
        self._clock = clock
        self._max_entries = max_entries
        self._tats: dict[tuple[str, int], int] = {}  # (key name, REQUESTS|TOKENS) -> TAT us

    def _now(self) -> int:
        return int(self._clock() * 1_000_000)

    def _plan(self, name: str, rpm: int, tpm: int, tokens: int, now: int) -> list[_Step]:
        """Per checked limit: (slot, new TAT, wait); wait <= 0 means it fits."""
        out = []
        for kind, limit, cost in ((REQUESTS, rpm, 1), (TOKENS, tpm, tokens)):
            if limit > 0:
                slot = (name, kind)
                new = max(self._tats.get(slot, 0), now)
                new += _interval_us(self.period_us, cost, limit)
                out.append((slot, new, new - self.period_us - now))
        return out

    def check(self, name: str, rpm: int, tpm: int, tokens: int) -> tuple[float, int]:
        """Admit and charge, or refuse: ``(0.0, 0)`` or ``(wait seconds, which limits)``.

        A limit <= 0 is not checked. Refused: nothing is charged."""
        now = self._now()
        plan = self._plan(name, rpm, tpm, tokens, now)
        which = sum(slot[1] for slot, _, wait in plan if wait > 0)
        if which:
            return max(wait for _, _, wait in plan) / 1_000_000, which
        self._store(plan, now)
        return 0.0, 0

    def charge(self, name: str, rpm: int, tpm: int, tokens: int) -> None:
        """Charge without checking (mirrors a Redis admission), capped at a full bucket."""
        now = self._now()
        cap = now + self.period_us
        plan = self._plan(name, rpm, tpm, tokens, now)
        self._store([(slot, min(new, cap), 0) for slot, new, _ in plan], now)

    def refund(self, name: str, tpm: int, tokens: int) -> None:
        """Give back ``tokens`` of the token limit (never beyond a full bucket)."""
        slot = (name, TOKENS)
        if tpm <= 0 or tokens <= 0 or slot not in self._tats:
            return
        new = self._tats[slot] - _interval_us(self.period_us, tokens, tpm)
        self._store([(slot, new, 0)], self._now())

    def _store(self, plan: list[_Step], now: int) -> None:
        for slot, new, _ in plan:
            if new > now:
                self._tats[slot] = new
            else:
                self._tats.pop(slot, None)  # full bucket: same as no entry
        if len(self._tats) > self._max_entries:
            self._tats = {s: tat for s, tat in self._tats.items() if tat > now}


class _Coalescer:
    """Single flight: entries submitted while a batch is in flight go out together next.

    ``run(entries)`` answers one reply per entry, or None (the caller then decides locally).
    """

    def __init__(self, run: Callable[[list[Entry]], Awaitable[list[Reply | None]]]) -> None:
        self._run = run
        self._queue: list[tuple[Entry, asyncio.Future[Reply | None]]] = []
        self._inflight: list[tuple[Entry, asyncio.Future[Reply | None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, entry: Entry) -> Reply | None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply | None] = loop.create_future()
        self._queue.append((entry, fut))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                self._inflight = self._queue[:MAX_BATCH]
                del self._queue[:MAX_BATCH]
                try:
                    replies = await self._run([entry for entry, _ in self._inflight])
                except Exception:  # a bug: never leave a request hanging
                    log.exception("rate limiter batch failed")
                    replies = [None] * len(self._inflight)
                for (_, fut), reply in zip(self._inflight, replies, strict=True):
                    if not fut.done():  # its request may have been cancelled meanwhile
                        fut.set_result(reply)
        finally:  # also on cancellation (close)
            self._release()

    def _release(self) -> None:
        """Everyone still waiting gets None (and so decides locally)."""
        for _, fut in self._inflight + self._queue:
            if not fut.done():
                fut.set_result(None)
        self._inflight, self._queue, self._task = [], [], None

    async def close(self) -> None:
        if (task := self._task) is not None:
            task.cancel()  # a task cancelled before it started never runs its finally:
            await asyncio.gather(task, return_exceptions=True)
        self._release()  # ... so release here too


def _redact(url: str) -> str:
    """``scheme://host:port/db`` without user, password or query (for logs)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2].split('?', 1)[0]}"


def _describe(exc: BaseException) -> str:
    """Exception class and message (redis-py messages name host:port, never credentials)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class RateLimiter:
    """``admit``/``refund`` per API key; Redis-shared, with a local GCRA fallback."""

    def __init__(
        self, client: aioredis.Redis | None, namespace: str = "kvroute", *,
        period_s: float = PERIOD_S, backoff_s: float = 1.0, op_timeout_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        if not _NAMESPACE_RE.match(namespace):
            raise ValueError(f"namespace must match {_NAMESPACE_RE.pattern}")
        self.client = client
        self.local = LocalGcra(period_s, clock)
        self._prefix = "{" + namespace + "-rl}:"
        self._clock = clock
        self._op_timeout_s = op_timeout_s
        self.breaker = CircuitBreaker("rate limiter", backoff_s, on_error, clock,
                                      "limits are per router replica until it is back")
        self._script = client.register_script(BATCH_LUA) if client is not None else None
        self._batches = _Coalescer(self._run_batch) if client is not None else None

    @classmethod
    def from_url(
        cls, redis_url: str | None, namespace: str = "kvroute", timeout_s: float = 0.05,
        **kwargs: Any,
    ) -> RateLimiter:
        """Shared through Redis at ``redis_url`` (redis://, rediss://, redis+sentinel://, AUTH in
        the URL), or
        local only when it is None or empty. ``timeout_s``: socket and connect timeout (the
        hard cap ``op_timeout_s`` defaults to twice that). ``kwargs`` go to ``RateLimiter``."""
        kwargs.setdefault("op_timeout_s", 2 * timeout_s)
        client = None
        if redis_url:
            client = async_client(
                redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0), health_check_interval=0,
            )
            log.info("rate limits shared through Redis at %s", _redact(redis_url))
        return cls(client, namespace, **kwargs)

    @property
    def shared(self) -> bool:
        """True while limits are enforced through Redis (across all router replicas)."""
        return self.client is not None and self.breaker.healthy

    def keys(self, name: str) -> list[str]:
        """The Redis keys of one API key: its request and token TATs."""
        return [f"{self._prefix}{name}:req", f"{self._prefix}{name}:tok"]

    async def admit(self, key: ApiKeyConfig, tokens: int | None, request: bool = True) -> None:
        """Charge one request (``request``) and ``tokens`` tokens (None: no token charge)
        to ``key``, or raise ``ApiError(429)``.

        ``tokens`` = prompt tokens + max_tokens. Keys without limits cost nothing."""
        rpm = (key.requests_per_min or 0) if request else 0
        tpm = (key.tokens_per_min or 0) if tokens is not None else 0
        if not rpm and not tpm:
            return
        tokens = max(0, int(tokens or 0)) if tpm else 0
        if tpm and tokens > tpm:
            raise ApiError(429, f"the request needs up to {tokens} tokens (prompt + max_tokens)"
                           f" but key {key.name!r} may use {tpm} tokens per minute; lower "
                           "max_tokens or shorten the prompt", "request_exceeds_rate_limit",
                           "max_tokens")
        wait, which = await self._check(key.name, rpm, tpm, tokens)
        if which:
            what = " and ".join(w for bit, w in ((REQUESTS, f"{rpm} requests"),
                                                 (TOKENS, f"{tpm} tokens")) if which & bit)
            raise ApiError(429, f"rate limit of key {key.name!r} exceeded ({what} per minute);"
                           f" retry in {wait:.1f} s", "rate_limit_exceeded",
                           retry_after_s=wait)

    async def _check(self, name: str, rpm: int, tpm: int, tokens: int) -> tuple[float, int]:
        if self._batches is not None and self._use_redis():
            reply = await self._batches.submit(("a", name, rpm, tpm, tokens))
            if reply is not None:
                admitted, wait_us, which = reply
                if admitted:
                    self.local.charge(name, rpm, tpm, tokens)
                return wait_us / 1_000_000, which
        return self.local.check(name, rpm, tpm, tokens)

    async def refund(self, key: ApiKeyConfig, tokens: int) -> None:
        """Give back ``tokens`` a request was charged but did not use. Never raises."""
        tpm = key.tokens_per_min or 0
        tokens = min(int(tokens), tpm)
        if tokens <= 0:
            return
        self.local.refund(key.name, tpm, tokens)
        if self._batches is not None and self._use_redis():
            await self._batches.submit(("r", key.name, 0, tpm, tokens))

    def _use_redis(self) -> bool:
        """Closed circuit, or time for the (single) probe after ``backoff_s``."""
        return self.breaker.allow()

    async def _run_batch(self, entries: list[Entry]) -> list[Reply | None]:
        """One script call for the batch; all None if the circuit opened meanwhile or it fails."""
        assert self._script is not None
        if not (self.breaker.healthy or self.breaker.probing):
            return [None] * len(entries)
        keys = [k for _, name, *_ in entries for k in self.keys(name)]
        args: list[Any] = [self.local.period_us]
        for op, _, rpm, tpm, tokens in entries:
            args += [op, rpm, tpm, tokens]
        try:
            async with asyncio.timeout(self._op_timeout_s):
                flat = [int(x) for x in await self._script(keys=keys, args=args)]
        except Exception as exc:
            self.breaker.failed("ratelimit", RuntimeError(_describe(exc)))
            return [None] * len(entries)
        finally:
            self.breaker.release()  # a cancelled probe must not keep the circuit shut
        self.breaker.succeeded()
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    async def close(self) -> None:
        if self._batches is not None:
            await self._batches.close()
        if self.client is not None:
            try:
                await self.client.aclose()
            except Exception:
                log.warning("closing the rate limiter's Redis client failed", exc_info=True)
