"""Configuration: one YAML file, validated at startup before anything deploys.

Every model is strict (``extra="forbid"``) so a typo fails fast with a clear
message instead of being silently ignored. ``serve run`` configs pass the same
structure as the application's ``args``. This module holds the top level
(``KvrouteConfig``, the server and Responses sections, ``load_config``); each other
section has its own module, and its names are re-exported here, where the rest of
kvroute imports the schema from.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ConfigDict, Field, model_validator

from deploy.config.auth import AuthConfig
from deploy.config.autoscale import AutoscalingConfig, AutoscalingPolicyName
from deploy.config.index import DEFAULT_BLOCK_SIZE, SENTINEL_SCHEME, IndexConfig, SentinelConfig
from deploy.config.model import (
    MODEL_CHECKS,
    VLLM_FORCED_ARGS,
    EngineName,
    GroupMember,
    MlxKwargs,
    ModelConfig,
    ModelGroup,
    SimKwargs,
    VllmKvEvents,
)
from deploy.config.router import LeaseConfig, PromptCacheConfig, RouterConfig
from deploy.config.safeguards import SafeguardMode, SafeguardsConfig
from deploy.config.schema import Strict

__all__ = [
    "APP_IMPORT_PATH", "DEFAULT_BLOCK_SIZE", "MODEL_CHECKS", "SENTINEL_SCHEME",
    "VLLM_FORCED_ARGS", "AutoscalingConfig", "AutoscalingPolicyName", "EngineName",
    "GroupMember", "IndexConfig", "KvrouteConfig", "LeaseConfig", "MlxKwargs", "ModelConfig",
    "ModelGroup", "PromptCacheConfig", "ResponsesConfig", "RouterConfig", "SafeguardMode",
    "SafeguardsConfig", "SentinelConfig",
    "ServerConfig", "SimKwargs", "VllmKvEvents", "load_config",
]


class ServerConfig(Strict):
    host: str = Field("127.0.0.1", description="Bind address; loopback unless configured.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port clients connect to.")
    ingress: Literal["auto", "proxy", "direct"] = Field(
        "auto", description="Who serves `host:port`. proxy: Serve's HTTP proxy, which passes "
        "each request and every streamed event to a router replica over gRPC. direct: every "
        "router replica listens on `host:port` itself (SO_REUSEPORT; the kernel spreads "
        "connections over a node's router replicas), one hop less per streamed event; Serve's "
        "proxy moves to a free loopback port. auto: direct where kvroute starts Serve itself "
        "(`kvroute up`) on a fixed port Serve's proxy does not hold; proxy otherwise, as with "
        "`serve deploy`, where http_options give the proxy the port (docs/deploy.md).",
    )
    proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode", description="Where Serve runs HTTP proxies (one per node, or head only)."
    )
    max_body_bytes: int = Field(
        8 << 20, ge=1024, le=1 << 30, description="Largest request body; over it a 413 before "
        "parsing (8 MiB holds a 200k-token conversation as JSON; docs/reliability.md).",
    )
    body_bytes_per_token: int = Field(
        32, ge=1, description="Cheap bound against the context window: a body over the "
        "largest window x this (+1 MiB) is a 413 before parsing, and a prompt with more text "
        "than its model's window x this is a 400 before templating or tokenizing.",
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive within this; a slower one is a "
        "408 (slowloris; 8 MiB needs 2.2 Mbit/s, LAN clients take milliseconds).",
    )
    max_body_waits_per_key: int = Field(
        256, ge=0, description="Requests of one key (keys off: one client address) that may "
        "be reading their body at once per router replica; the next is a fast 429, so one "
        "key's slow bodies cannot take every request slot (both ingresses). 0: no bound.",
    )
    max_header_bytes: int = Field(
        64 << 10, ge=4096, description="Largest request head (request line and headers); over "
        "it a 431 and the connection closes (ingress direct; docs/reliability.md).",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request head must arrive within this of the connection "
        "opening (or of its first byte on a kept-alive connection), else the connection "
        "closes: idle floods and slowloris (ingress direct).",
    )
    keep_alive_s: float = Field(
        75.0, gt=0, description="An idle kept-alive connection closes after this; keep it "
        "above the idle timeout of a load balancer in front (ingress direct).",
    )
    max_connections: int = Field(
        8192, ge=1, description="Open connections per router replica (and below its "
        "file-descriptor limit, less 1,024 kept for Redis and Serve); past it a 503 with "
        "retry-after (ingress direct).",
    )
    max_connections_per_client: int = Field(
        1024, ge=0, description="Open connections from one client address per router replica; "
        "0: no cap (behind a load balancer every connection has its address: raise it or "
        "set 0 there, and cap clients at the balancer).",
    )
    request_timeout_s: float | None = Field(
        3600.0, gt=0, description="End-to-end deadline of every request, streams included, "
        "enforced by the router itself and by Serve's proxy (http_options): above the "
        "longest generation you serve; None = no limit.",
    )

    @model_validator(mode="after")
    def _direct_needs_a_port(self) -> ServerConfig:
        if self.ingress == "direct" and self.port == 0:  # each replica would pick its own
            raise ValueError("server.ingress 'direct' needs a fixed server.port, not 0")
        return self


class ResponsesConfig(Strict):
    """The Responses API's stored responses (``store: true``, ``previous_response_id``)."""

    store_ttl_s: float = Field(86400.0, gt=0, description="How long a stored response can "
                               "be continued with previous_response_id.")
    max_entry_bytes: int = Field(
        16 << 20, ge=1024, description="Largest stored response (the whole conversation as "
        "JSON, before compression); a larger one is served but not stored.",
    )
    memory_bytes: int = Field(
        256 << 20, ge=0, description="Local copies kept per router replica (LRU); the only "
        "store without Redis, the fallback while Redis is unreachable. One key keeps at most a "
        "quarter of it, locally and in Redis.",
    )


class KvrouteConfig(Strict):
    # The outermost model decides: no config error may echo its input (a key pasted
    # into key_sha256 by mistake).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    models: list[ModelConfig] = Field(min_length=1, description="Served models.")
    groups: list[ModelGroup] = Field(
        default_factory=list, description="Aliases over several models ('auto' = all "
        "models unless defined). Members must share a tokenizer and chat template.",
    )
    index: IndexConfig = Field(default_factory=IndexConfig, description="Prefix index.")
    router: RouterConfig = Field(default_factory=RouterConfig, description="Router ingress.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP server.")
    auth: AuthConfig = Field(
        default_factory=AuthConfig, description="API keys and per-key rate limits (docs/auth.md)."
    )
    aliases: dict[str, str] = Field(
        default_factory=dict, description="Model-name patterns (fnmatch: `claude-*`, `gpt-*`, "
        "`*`) to a model or group, for clients that ask for their vendor's names; tried in "
        "order after exact model and group names.",
    )
    responses: ResponsesConfig = Field(
        default_factory=ResponsesConfig, description="Stored responses of /v1/responses."
    )
    safeguards: SafeguardsConfig = Field(
        default_factory=SafeguardsConfig, description="Safety verdicts on the tool calls of "
        "a reply, for clients that ask (Claude Code's auto mode; docs/api.md).",
    )

    @model_validator(mode="after")
    def _unique(self) -> KvrouteConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate model names: {names}")
        for g in self.groups:
            if g.name in names:
                raise ValueError(f"group {g.name!r} has the name of a model")
            unknown = [m.model for m in g.models if m.model not in names]
            if unknown:
                raise ValueError(f"group {g.name!r} names unknown models {unknown}")
        if len({g.name for g in self.groups}) != len(self.groups):
            raise ValueError("duplicate group names")
        if self.index.maintenance_timeout_s >= self.router.maintenance_s:
            raise ValueError("index.maintenance_timeout_s must be under router.maintenance_s")
        known = {*names, *(g.name for g in self.groups), "auto"}
        for pattern, target in self.aliases.items():
            if target not in known:
                raise ValueError(f"alias {pattern!r} names {target!r}, which is not a model "
                                 "or group of this config")
        if self.safeguards.model is not None and self.safeguards.model not in known:
            raise ValueError(f"safeguards.model names {self.safeguards.model!r}, which is not "
                             "a model or group of this config")
        scaling = self.router.autoscaling
        if self.server.ingress == "direct" and scaling is not None and scaling.min_replicas < 1:
            # clients reach router replicas on their own listeners: none to take the request
            raise ValueError("router.autoscaling.min_replicas must be >= 1 with server.ingress "
                             "'direct' (no router replica, no listener to wake one)")
        return self

    def resolve(self, name: str) -> dict[str, float] | None:
        """A model or group name -> {model: preference weight}; None if unknown."""
        if self.model(name) is not None:
            return {name: 1.0}
        group = next((g for g in self.groups if g.name == name), None)
        if group is not None:
            return {m.model: m.weight for m in group.models}
        if name == "auto":
            return {m.name: 1.0 for m in self.models}
        target = next((t for p, t in self.aliases.items() if fnmatch.fnmatchcase(name, p)), None)
        return self.resolve(target) if target is not None else None

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


APP_IMPORT_PATH = "deploy.serve.builder:app_builder"


def load_config(path: str | Path) -> KvrouteConfig:
    """A kvroute YAML, or a Serve config whose kvroute application carries it as ``args``."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if isinstance(data, dict) and "applications" in data:
        apps = [a for a in data["applications"] if a.get("import_path") == APP_IMPORT_PATH]
        if len(apps) != 1:
            raise ValueError(f"{path}: expected one application with import_path "
                             f"{APP_IMPORT_PATH!r}, found {len(apps)}")
        data = apps[0].get("args") or {}
    return KvrouteConfig.model_validate(data)
