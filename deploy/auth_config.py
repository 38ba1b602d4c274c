"""The ``auth`` section of the config: API keys (as SHA-256 digests) and rate limits.

Schema only (imports nothing from the runtime); parsing keys from the environment,
hashing and authenticating requests live in ``router.auth``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$"
MAX_TOKENS_PER_MIN = 100_000_000  # keeps the GCRA arithmetic exact in Lua doubles
HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


class _Strict(BaseModel):
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
