"""The ``auth`` section of the config: API keys (as SHA-256 digests) and rate limits.

Schema only (imports nothing from the runtime); parsing keys from the environment,
hashing and authenticating requests live in ``router.auth.keys``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from deploy.config.schema import ENV_NAME, RedisUrlSource, Strict

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$"
MAX_TOKENS_PER_MIN = 100_000_000  # keeps the GCRA arithmetic exact in Lua doubles
HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


class _Strict(Strict):
    # hide_input_in_errors: a plain key pasted into key_sha256 must not end up in the error.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class ApiKeyConfig(_Strict):
    name: str = Field(
        pattern=NAME_PATTERN,
        description="Who the key belongs to: in logs, metrics and rate-limit keys (not secret).",
    )
    key_sha256: str = Field(
        repr=False, description="SHA-256 hex digest of the key (`kvroute keys new`)."
    )
    requests_per_min: int | None = Field(
        None, ge=1, description="Requests per minute; None = `default_requests_per_min`."
    )
    tokens_per_min: int | None = Field(
        None, ge=1, le=MAX_TOKENS_PER_MIN,
        description="Prompt + max_tokens per minute; None = `default_tokens_per_min`.",
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex64(cls, v: str) -> str:
        if not HEX64.match(v):
            raise ValueError("must be 64 hex digits (the SHA-256 of the key), not the key")
        return v.lower()


class RateLimitStoreConfig(RedisUrlSource):
    """Where the per-key rate-limit state lives (docs/auth.md, "Rate-limit store").

    Its own Redis, with ``maxmemory-policy noeviction``: the index's Redis evicts under
    memory pressure (``volatile-lru``), and an evicted limit key is a full bucket."""

    model_config = _Strict.model_config
    section: ClassVar[str] = "auth.rate_limit_store"
    redis_url: str | None = Field(
        None, description="Redis URL of the limiter's store (no password here: it sits in "
        "the Serve config; use redis_url_env). None and no env = the index's Redis, with a "
        "warning at start.",
    )
    redis_url_env: str | None = Field(
        None, pattern=ENV_NAME, description="Name of an environment variable holding the "
        "limiter store's URL, read by each router replica from its own environment.",
    )

    @property
    def configured(self) -> bool:
        return bool(self.redis_url or self.redis_url_env)


class AuthConfig(_Strict):
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="Keys (hashed). None here or in the env = open."
    )
    api_keys_env: str = Field(
        "KVROUTE_API_KEYS", description="Environment variable with more keys "
        "(`name:sha256[:rpm[:tpm]]` or `name=key[:rpm[:tpm]]`, comma-separated); '' = none.",
    )
    default_requests_per_min: int | None = Field(
        None, ge=1, description="Requests/min of keys that set none; None = unlimited."
    )
    default_tokens_per_min: int | None = Field(
        None, ge=1, le=MAX_TOKENS_PER_MIN,
        description="Tokens/min (prompt + max_tokens) of keys that set none; None = unlimited.",
    )
    required: bool = Field(
        True, description="Refuse to start with no key when server.host is not loopback; "
        "false only behind a gateway that authenticates (docs/auth.md).",
    )
    key_names_in_metrics: bool = Field(
        False, description="Label the per-key metrics (kvroute_key_*) with key names; false: "
        "'keyed'. /metrics is open, so names there are public (the access log always has "
        "them; docs/observability.md).",
    )
    rate_limit_store: RateLimitStoreConfig = Field(
        default_factory=RateLimitStoreConfig, description="A Redis for the rate-limit state "
        "that does not evict; unset = the index's Redis (warned).",
    )

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        check_unique_keys(self.api_keys)
        return self


def check_unique_keys(keys: Sequence[ApiKeyConfig]) -> None:
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate API key names: {dup}")
    if len({k.key_sha256 for k in keys}) != len(keys):
        raise ValueError("the same key is configured under two names")
