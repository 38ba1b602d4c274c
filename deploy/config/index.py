"""The prefix index's section (``index``): embedded memory or shared Redis, and its
timing and tenant settings.

Schema only: imports no other kvroute package but the schema's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, model_validator

from deploy.config.schema import ENV_NAME, RedisUrlSource, Strict

# Tokens per prefix-index block (cache_service.hashing); why 64: docs/prefix-index.md.
DEFAULT_BLOCK_SIZE = 64


# A Redis behind Sentinel, as a URL (cache_service.redis_conn opens it):
# redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]
SENTINEL_SCHEME = "redis+sentinel"
_HOST_PORT = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$"


class SentinelConfig(Strict):
    """The Sentinels that watch the Redis primary: every router and worker asks them for the
    current primary, so a failover moves the whole fleet to the promoted replica."""

    sentinels: list[str] = Field(min_length=1, description="HOST:PORT of each Sentinel.")
    master: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
                        description="The primary's name in the Sentinels' config.")
    db: int = Field(0, ge=0, description="Database number.")

    @model_validator(mode="after")
    def _addresses(self) -> SentinelConfig:
        bad = [a for a in self.sentinels if not re.match(_HOST_PORT, a)]
        if bad:
            raise ValueError(f"index.redis_sentinel.sentinels: not HOST:PORT: {bad}")
        return self

    def url(self) -> str:
        """The Sentinel URL; a password for the data nodes goes in redis_url_env instead."""
        return f"{SENTINEL_SCHEME}://{','.join(self.sentinels)}/{self.master}/{self.db}"


class IndexConfig(RedisUrlSource):
    section: ClassVar[str] = "index"
    redis_url: str | None = Field(
        None, description="Redis URL for the shared index; None = embedded memory index. "
        "It sits in the Serve config: no password here, use redis_url_env.",
    )
    redis_url_env: str | None = Field(
        None, pattern=ENV_NAME, description="Name of an environment "
        "variable holding the Redis URL (with its password), read by each router and worker "
        "process from its own environment, so the secret never enters Serve's config.",
    )
    redis_sentinel: SentinelConfig | None = Field(
        None, description="Redis behind Sentinel, for failover (instead of redis_url; the "
        "token, response and rate-limit stores follow it too). With a password, put the "
        "Sentinel URL (redis+sentinel://:PASSWORD@HOST:PORT,.../MASTER/DB) in redis_url_env.",
    )
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=4096, description="Tokens per block.")
    namespace: str = Field("kvroute", description="Redis key namespace (hash tag).")
    routed_ttl_s: float = Field(120.0, gt=0, description="TTL of blocks recorded at routing.")
    stored_ttl_s: float = Field(3600.0, gt=0, description="TTL of engine-confirmed blocks.")
    liveness_ttl_s: float = Field(10.0, gt=0, description="Replica dead after this silence.")
    session_ttl_s: float = Field(3600.0, gt=0, description="How long a session's last "
                                 "(model, replica) is remembered, shared by all routers.")
    timeout_s: float = Field(0.05, gt=0, description="Per-call Redis timeout.")
    op_timeout_s: float = Field(0.25, gt=0, description="Hard cap on a routing-path index "
                                "call, on top of the socket timeout.")
    maintenance_timeout_s: float = Field(
        0.5, gt=0, description="Hard cap on each maintenance call (replica removals, purges, "
        "stats): under router.maintenance_s, so a Redis that trickles its replies cannot "
        "hold up the maintenance loop.",
    )
    backoff_s: float = Field(1.0, gt=0, description="After a Redis failure, calls are "
                             "answered locally this long, then one probe tries Redis again.")
    publish_flush_s: float = Field(0.05, gt=0, description="How often a worker flushes its "
                                   "cache events to Redis.")
    heartbeat_s: float = Field(2.0, gt=0, description="How often a worker tells Redis it is "
                               "alive (must stay well under liveness_ttl_s).")
    tenant_isolation: bool = Field(
        False, description="Salt block hashes and engine KV per tenant (the API key's name): "
        "tenants never share cached prefixes nor learn of each other's (a system prompt "
        "common to several tenants is then prefilled once per tenant; docs/auth.md).",
    )
    predicted_cached_header: bool | None = Field(
        None, description="Send x-kvroute-predicted-cached-tokens. None: unless API keys are "
        "configured and tenant_isolation is off (it would tell one tenant whether another's "
        "prompt is cached).",
    )

    def resolved(self, environ: Mapping[str, str] | None = None) -> IndexConfig:
        """The config with ``redis_url`` read from ``redis_url_env`` in this process's
        environment; a missing variable fails the replica's start (never a silent memory
        index next to replicas sharing Redis)."""
        if self.redis_sentinel is not None:
            return self.model_copy(update={"redis_url": self.redis_sentinel.url(),
                                           "redis_sentinel": None})
        if not self.redis_url_env:
            return self
        return self.model_copy(update={"redis_url": self.url(environ), "redis_url_env": None})

    @model_validator(mode="after")
    def _one_redis(self) -> IndexConfig:
        if self.redis_sentinel is not None and (self.redis_url or self.redis_url_env):
            raise ValueError("set index.redis_sentinel or redis_url/redis_url_env, not both")
        return self
