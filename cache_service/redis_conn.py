"""One way to open a Redis client from a URL, for every store kvroute keeps in Redis (the
prefix index, the token store, the response store, rate limits, pre-warm's table).

Besides redis-py's own URLs (``redis://``, ``rediss://``, ``unix://``) it takes a Sentinel
URL, so a fleet survives the loss of its Redis primary::

    redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]

The client asks the Sentinels for the current primary before each new connection and drops
its connections to a demoted one (redis-py's ``SentinelConnectionPool``; a write answered
``READONLY`` reconnects), so after a failover the next call reaches the promoted replica.
Lua scripts are ``register_script`` objects, which reload themselves on ``NOSCRIPT`` (a
promoted replica may not have them cached). The password, if any, is the data nodes'; the
Sentinels are reached without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from deploy.config import SENTINEL_SCHEME


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A parsed Sentinel URL: where the Sentinels are and which primary to ask for."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME + "://")


def parse_sentinel(url: str) -> SentinelTarget:
    """``redis+sentinel://[:pw@]h1:p1,h2:p2/master[/db]`` → its parts; ValueError if malformed."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = tuple(_host_port(h) for h in hosts.split(",") if h)
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"a Sentinel URL is {SENTINEL_SCHEME}://HOST:PORT[,HOST:PORT...]"
                         "/MASTER_NAME[/DB]")
    return SentinelTarget(sentinels, unquote(path[0]), int(path[1]) if len(path) == 2 else 0,
                          unquote(parts.password) if parts.password else None)


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Sentinel address {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``url`` (redis-py's URLs or a Sentinel URL); ``options`` as
    ``redis.asyncio.Redis`` takes them (timeouts, retry, decode_responses, ...)."""
    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **options)
    target = parse_sentinel(url)
    sentinel = AsyncSentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(options))
    return sentinel.master_for(target.master, db=target.db, password=target.password, **options)


def sync_client(url: str, **options: Any) -> redis.Redis:
    """The blocking client for ``url``, for the stores that run in a thread."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    target = parse_sentinel(url)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(options))
    return sentinel.master_for(target.master, db=target.db, password=target.password, **options)


def _sentinel_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The Sentinels get the same socket timeouts as the data nodes: a Sentinel that does not
    answer must not hold a routing-path call longer than Redis itself may."""
    return {k: v for k, v in options.items() if k.startswith("socket_")}
