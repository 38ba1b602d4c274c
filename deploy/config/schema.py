"""What every config section shares: the strict base model, and a Redis URL given in
the config or named by an environment variable (secrets stay out of Serve's config).

Schema only: imports no other kvroute package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Strict(BaseModel):
    """Unknown keys fail at load (a typo is an error, never silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def url_from_env(setting: str, var: str, environ: Mapping[str, str] | None = None) -> str:
    """The URL in ``$var`` of this process's environment; a missing one fails the replica's
    start (never a silent fallback next to replicas that share the store)."""
    url = (os.environ if environ is None else environ).get(var, "")
    if not url:
        raise ValueError(f"{setting}: ${var} is not set in this process's environment "
                         "(set it on every node or pod)")
    return url


class RedisUrlSource(Strict):
    """A section with ``redis_url`` and ``redis_url_env`` (subclasses declare both fields,
    with their own descriptions): at most one may be set."""

    section: ClassVar[str]  # the section's path in the config, for error messages
    redis_url: str | None
    redis_url_env: str | None

    @model_validator(mode="after")
    def _one_url(self) -> RedisUrlSource:
        if self.redis_url and self.redis_url_env:
            raise ValueError(f"set {self.section}.redis_url or redis_url_env, not both")
        return self

    def url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """``redis_url``, or the URL read from ``redis_url_env`` in this process."""
        if self.redis_url_env:
            return url_from_env(f"{self.section}.redis_url_env", self.redis_url_env, environ)
        return self.redis_url
