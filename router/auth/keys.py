"""API keys: configuration, hashing and request authentication.

Keys are only ever stored as SHA-256 hex digests (``key_sha256``). They come from the config
file (``auth.api_keys``) and/or from one environment variable (``auth.api_keys_env``, default
``KVROUTE_API_KEYS``): entries separated by commas or whitespace, each either

* ``name:SHA256HEX[:RPM[:TPM]]``: an already hashed key (recommended), or
* ``name=KEY[:RPM[:TPM]]``: a plain key, hashed while the variable is parsed; only the digest
  is kept (the variable itself stays in the process environment: prefer the hashed form).
  A plain key may not contain ``:``, ``,`` or whitespace (generated keys never do).

RPM/TPM are requests and tokens per minute; an empty or missing field means "use the
default" (``default_requests_per_min`` / ``default_tokens_per_min``; ``None`` = unlimited).
E.g. ``KVROUTE_API_KEYS="alice:3f7a...e1:60:200000,ci=sk-kvr-abc::50000"``.

With no key configured anywhere the service is open (``Authenticator.enabled`` is False) and
should stay on loopback (``ServerConfig.host`` defaults to 127.0.0.1; see
``exposure_warning``). With keys, every request must send ``Authorization: Bearer KEY`` or
``x-api-key: KEY``; anything else is a 401. The presented key is hashed and compared with
every configured digest by ``hmac.compare_digest`` (no early exit), so timing reveals nothing
about which digest (if any) matched. Keys, digests and plain parts of the variable never go
into logs, error messages or reprs (``hide_input_in_errors``, ``repr=False``).

``kvroute keys new [NAME] [--rpm N] [--tpm N]`` (ops/keys.py; ``python -m router.auth`` is an
alias) prints a new key, its digest and the config/env lines to use.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence

from pydantic import (
    ValidationError,
)

from deploy.config.auth import (
    HEX64,
    NAME_PATTERN,
    ApiKeyConfig,
    AuthConfig,
    check_unique_keys,
)
from router.errors import ApiError

__all__ = [
    "ApiKeyConfig",
    "AuthConfig",
    "Authenticator",
    "exposure_warning",
    "generate_key",
    "hash_key",
    "is_loopback",
    "parse_env_keys",
    "resolve_env",
    "resolve_for_replicas",
]

KEY_PREFIX = "sk-kvr-"
_SEPARATORS = re.compile(r"[,\s]+")


def hash_key(plain: str) -> str:
    """The SHA-256 hex digest under which a key is configured."""
    return hashlib.sha256(plain.encode("utf-8")).hexdigest()


def generate_key(prefix: str = KEY_PREFIX) -> tuple[str, str]:
    """A new random key (256 bits, URL-safe) and its digest: ``(key, key_sha256)``."""
    key = prefix + secrets.token_urlsafe(32)
    return key, hash_key(key)


def _limit(field: str, what: str, where: str) -> int | None:
    if not field:
        return None
    if not field.isdigit() or int(field) < 1:
        raise ValueError(f"{where}: {what} must be a positive integer")
    return int(field)


def _parse_entry(entry: str, where: str) -> ApiKeyConfig:
    """One env entry → ApiKeyConfig; errors name the entry's position, never its secret."""
    if "=" in entry.split(":", 1)[0]:  # name=KEY[:rpm[:tpm]]
        name, rest = entry.split("=", 1)
        secret, *limits = rest.split(":")
        digest = hash_key(secret) if secret else ""
    else:  # name:SHA256[:rpm[:tpm]]
        name, _, rest = entry.partition(":")
        digest, *limits = rest.split(":")
    if not re.match(NAME_PATTERN, name):
        raise ValueError(f"{where}: key name must match {NAME_PATTERN}")
    if not HEX64.match(digest):
        raise ValueError(f"{where} ({name}): expected name:SHA256HEX[:rpm[:tpm]] or "
                         "name=KEY[:rpm[:tpm]] (the hash must be 64 hex digits)")
    if len(limits) > 2:
        raise ValueError(f"{where} ({name}): too many ':' fields")
    limits += ["", ""]
    try:
        return ApiKeyConfig(
            name=name, key_sha256=digest,
            requests_per_min=_limit(limits[0], "requests/min", f"{where} ({name})"),
            tokens_per_min=_limit(limits[1], "tokens/min", f"{where} ({name})"),
        )
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{where} ({name}): {first['loc'][0]}: {first['msg']}") from None


def parse_env_keys(value: str, var: str = "KVROUTE_API_KEYS") -> list[ApiKeyConfig]:
    """Parse the env format (module docstring). Plain keys are hashed and dropped."""
    entries = [e for e in _SEPARATORS.split(value.strip()) if e]
    return [_parse_entry(e, f"{var} entry {i + 1}") for i, e in enumerate(entries)]


def load_keys(cfg: AuthConfig, environ: Mapping[str, str] | None = None) -> list[ApiKeyConfig]:
    """Config keys + env keys, with the default limits filled in (the effective limits)."""
    keys = resolve_env(cfg, environ).api_keys
    return [
        k.model_copy(update={
            "requests_per_min": k.requests_per_min or cfg.default_requests_per_min,
            "tokens_per_min": k.tokens_per_min or cfg.default_tokens_per_min,
        })
        for k in keys
    ]


def resolve_env(cfg: AuthConfig, environ: Mapping[str, str] | None = None) -> AuthConfig:
    """``cfg`` with the env keys folded into ``api_keys`` (as digests) and ``api_keys_env``
    cleared: call it where the config is loaded (the CLI / app builder), so that router
    replicas get digests in their deployment args and need no secret in their environment."""
    env = os.environ if environ is None else environ
    raw = env.get(cfg.api_keys_env, "") if cfg.api_keys_env else ""
    keys = [*cfg.api_keys, *parse_env_keys(raw, cfg.api_keys_env)]
    return AuthConfig.model_validate({**cfg.model_dump(), "api_keys": keys, "api_keys_env": ""})


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup (Starlette ``Headers`` already are; plain dicts are not)."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """The keys a request presents: ``x-api-key`` and/or ``Authorization: Bearer``."""
    out = []
    if (api_key := (_header(headers, "x-api-key") or "").strip()):
        out.append(api_key)
    scheme, _, token = (_header(headers, "authorization") or "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        out.append(token.strip())
    return out


class Authenticator:
    """Checks a request's key against the configured digests (constant time)."""

    def __init__(self, keys: Sequence[ApiKeyConfig]) -> None:
        check_unique_keys(keys)
        self._keys = [(bytes.fromhex(k.key_sha256), k) for k in keys]
        # told each caller's key name (None: keys off), for per-key metrics and access log
        self.on_caller: Callable[[str | None], None] = lambda _name: None

    @classmethod
    def from_config(
        cls, cfg: AuthConfig, environ: Mapping[str, str] | None = None
    ) -> Authenticator:
        return cls(load_keys(cfg, environ))

    @property
    def enabled(self) -> bool:
        """False when no key is configured: every request is let in, anonymously."""
        return bool(self._keys)

    @property
    def names(self) -> list[str]:
        return [k.name for _, k in self._keys]

    def _match(self, presented: str) -> ApiKeyConfig | None:
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found = None
        for expected, key in self._keys:  # every digest, no early exit
            if hmac.compare_digest(expected, digest):
                found = key
        return found

    def authenticate(self, headers: Mapping[str, str]) -> ApiKeyConfig | None:
        """The caller's key (None when auth is off); ``ApiError(401)`` when missing or wrong."""
        if not self._keys:
            self.on_caller(None)
            return None
        presented = presented_keys(headers)
        if not presented:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' or "
                           "'x-api-key: <key>'", "missing_api_key")
        for candidate in presented:
            if (key := self._match(candidate)) is not None:
                self.on_caller(key.name)
                return key
        raise ApiError(401, "invalid API key", "invalid_api_key")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, auth: Authenticator) -> str | None:
    """A warning to log when the server is open (no keys) yet bound beyond loopback."""
    if auth.enabled or is_loopback(host):
        return None
    return (f"no API keys are configured but the server binds to {host}: anyone who can "
            "reach it can use it (configure auth.api_keys or KVROUTE_API_KEYS)")


def resolve_for_replicas(cfg: AuthConfig, host: str,
                         environ: Mapping[str, str] | None = None) -> AuthConfig:
    """The auth section every router replica gets: env keys folded in as digests (so no
    replica reads its own environment), checked against ``required``: no key while bound
    beyond loopback is a ``ValueError`` (the deploy fails) unless ``required`` is false."""
    resolved = resolve_env(cfg, environ)
    if cfg.required and not resolved.api_keys and not is_loopback(host):
        var = cfg.api_keys_env or "auth.api_keys_env"
        raise ValueError(f"auth.required: server.host is {host} but no API key is configured "
                         f"(auth.api_keys or ${var} where the app is built); set "
                         "auth.required: false only behind a gateway that authenticates")
    return resolved

