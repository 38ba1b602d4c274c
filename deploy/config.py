"""Configuration: one YAML file, validated at startup before anything deploys.

Every model is strict (``extra="forbid"``) so a typo fails fast with a clear
message instead of being silently ignored. ``serve run`` configs pass the same
structure as the application's ``args``.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deploy.auth_config import ENV_NAME, AuthConfig, url_from_env
from deploy.routing import PipelineConfig, profile

EngineName = Literal["mlx", "vllm", "sim"]
AutoscalingPolicyName = Literal["serve-default", "kvroute"]
# Tokens per prefix-index block (cache_service.hashing); why 64: docs/prefix-index.md.
DEFAULT_BLOCK_SIZE = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AutoscalingConfig(_Strict):
    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running.")
    max_replicas: int = Field(1, ge=1, description="Most replicas Serve may start.")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Ongoing requests per replica that autoscaling aims for."
    )
    upscale_delay_s: float = Field(10.0, ge=0, description="How long load must stay high.")
    downscale_delay_s: float = Field(60.0, ge=0, description="How long load must stay low.")
    policy: AutoscalingPolicyName = Field(
        "serve-default", description="`serve-default`: Serve's policy on ongoing requests "
        "per replica (target_ongoing_requests). `kvroute`: replicas for a TTFT objective, "
        "from the workers' prefill backlog and offered prefill load "
        "(deploy.autoscale_policy; docs/deploy.md).",
    )
    ttft_target_s: float = Field(
        2.0, gt=0, description="`kvroute` policy: the time to first token to keep "
        "requests under; it sizes the fleet so queueing plus own prefill stays below it.",
    )
    startup_s: float = Field(
        10.0, gt=0, description="`kvroute` policy: a new replica's start-up time before one "
        "is measured (then learned from replicas that start).",
    )
    metrics_interval_s: float = Field(
        10.0, gt=0, description="How often replicas and handles push load to Serve's "
        "autoscaler (Serve's metrics_interval_s; the kvroute policy wants ~1 s).",
    )
    look_back_period_s: float = Field(
        30.0, gt=0, description="Window Serve keeps (and averages, for serve-default) load "
        "reports over; the kvroute policy reads arrival rates over it. Must exceed "
        "metrics_interval_s.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError("look_back_period_s must be > metrics_interval_s")
        return self


class MlxKwargs(_Strict):
    """``engine_kwargs`` of the mlx engine (None: the engine's own default)."""

    cache_bytes: int | None = Field(None, ge=1 << 20, description="Prefix KV store budget.")
    max_cache_entries: int | None = Field(None, ge=1, description="Prefix KV store entries.")
    prefill_step_size: int | None = Field(None, ge=1, description="Tokens per prefill step.")
    max_batch: int | None = Field(None, ge=1, description="Sequences decoding together.")
    prefill_batch_size: int | None = Field(None, ge=1, description="Prompts prefilled together.")
    disk_bytes: int | None = Field(None, ge=0, description="Disk tier of the prefix KV store "
                                   "(evicted entries spill to files, reloaded on a hit); 0: off.")
    disk_path: str | None = Field(None, description="Disk tier folder (default: a temporary one).")
    lease_fraction: float | None = Field(None, ge=0, le=1,
                                         description="Most of cache_bytes leases may hold.")


class SimKwargs(_Strict):
    """``engine_kwargs`` of the sim engine emulator (None: the emulator's own default)."""

    kv_blocks: int | None = Field(None, ge=1, description="KV capacity in blocks.")
    block_size: int | None = Field(None, ge=1, description="Must equal index.block_size.")
    prefill_tok_s: float | None = Field(None, gt=0, description="Prefill rate (tokens/s).")
    tpot_s: float | None = Field(None, ge=0, description="Decode step at batch 1 (s).")
    tpot_per_batch_s: float | None = Field(None, ge=0, description="Added per extra sequence.")
    vocab_size: int | None = Field(None, ge=1, description="Token ids emitted are below it.")
    eos_every: int | None = Field(None, ge=0, description="An EOS every N tokens; 0: never.")
    script_path: str | None = Field(None, description="Scripted replies (workers/sim_script.py).")
    host_kv_blocks: int | None = Field(None, ge=0, description="Host-tier KV blocks; 0: none.")
    host_reload_tok_s: float | None = Field(None, gt=0, description="Host -> device reload rate.")
    lease_fraction: float | None = Field(None, ge=0, le=1,
                                         description="Most of the KV that leases may hold.")


class VllmKvEvents(_Strict):
    """Benchmark only: a sim replica's KV events in vLLM's ZMQ format (workers/vllm_events)."""

    block_size: int = Field(16, ge=1, description="Block size of the events (tokens); must "
                            "divide index.block_size. Give the peer router the same value.")


# vLLM takes its own engine arguments (passed through); kvroute sets these itself.
VLLM_FORCED_ARGS = ("model", "enable_prefix_caching", "kv_events_config")

# Checks the runtime adds for names only it knows (router.tool_parsers adds the tool-call
# family check, router.reasoning_parsers the reasoning format check, when imported), run
# on each model at load, so a typo fails before deploying.
MODEL_CHECKS: list[Callable[[ModelConfig], object]] = []


class ModelConfig(_Strict):
    name: str = Field(description="Name clients send as `model`; also the deployment name.")
    engine: EngineName = Field("mlx", description="Which engine adapter hosts the model.")
    model_path: str = Field(description="Local checkpoint folder or hub id of the model.")
    engine_kwargs: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="Engine-specific options (e.g. cache_bytes)."
    )
    num_replicas: int | None = Field(
        2, ge=1, description="Fixed replica count; ignored when `autoscaling` is set."
    )
    autoscaling: AutoscalingConfig | None = Field(None, description="Serve autoscaling.")
    max_ongoing_requests: int = Field(
        16, ge=1, description="Per-replica concurrency cap; beyond it requests queue."
    )
    max_queued_requests: int = Field(
        64, ge=1, description="Requests a router replica may queue for this model beyond "
        "capacity; past it clients get a fast 503 with retry-after.",
    )
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved per replica.")
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="Spread replicas: at most this many on one node."
    )
    context_window: int = Field(32768, ge=16, description="Max prompt + output tokens.")
    routing_stats_period_s: float = Field(
        1.0, gt=0, description="How often Serve collects each replica's load report for the "
        "routers (kvroute sim's stats_period_s models it).")
    supports_tools: bool = Field(True, description="Whether the model can call tools.")
    reasoning_parser: str | None = Field(
        None, description="Reasoning format (router.reasoning_parsers, e.g. `qwen3`, "
        "`gpt-oss`); None: detected from the chat template; `none`: no parsing.")
    cost_per_mtok: float = Field(0.0, ge=0.0, description="Relative cost per 1M tokens.")
    direct_http: bool = Field(
        False, description="Also serve each replica's own OpenAI endpoint on 127.0.0.1 "
        "(bypassing the router), e.g. to benchmark other routers over the same replicas; "
        "its POST routes need the deployment's random token (/kvroute/replicas lists it).",
    )
    default_max_tokens: int = Field(
        1024, ge=1, description="Output limit when a request sets none (capped by context)."
    )
    tool_parser: str | None = Field(
        None, description="Tool-call family (router.tool_parsers, e.g. `qwen3-coder`); "
        "None: detected from the model's chat template and special tokens.",
    )
    vllm_kv_events: VllmKvEvents | None = Field(
        None, description="Benchmark only, sim engine: each replica also publishes its KV "
        "events in vLLM's ZMQ format on 127.0.0.1 (for peer routers that index them).",
    )

    @model_validator(mode="after")
    def _engine_kwargs(self) -> ModelConfig:
        """Each engine's kwargs checked at load, before anything deploys (a typo such as
        ``cache_byte`` would otherwise keep the default silently)."""
        kw = self.engine_kwargs
        if self.engine == "mlx":
            MlxKwargs.model_validate(kw)
        elif self.engine == "sim":
            SimKwargs.model_validate(kw)
        elif bad := sorted(set(kw) & set(VLLM_FORCED_ARGS)):
            raise ValueError(f"engine_kwargs may not set {bad}: the vllm engine sets them")
        if self.vllm_kv_events is not None and self.engine != "sim":
            raise ValueError("vllm_kv_events is only available with the sim engine")
        for check in MODEL_CHECKS:
            check(self)
        return self

    def mlx_kwargs(self) -> MlxKwargs:
        return MlxKwargs.model_validate(self.engine_kwargs)

    @field_validator("model_path")
    @classmethod
    def _expand(cls, v: str) -> str:
        return os.path.expanduser(v) if v.startswith("~") else v

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not v or any(c in v for c in " /#{}"):
            raise ValueError("model name must be non-empty without spaces, '/', '#', '{', '}'")
        return v


class GroupMember(_Strict):
    model: str = Field(description="A model of this config.")
    weight: float = Field(1.0, gt=0.0, le=1.0, description="Preference within the group.")


class ModelGroup(_Strict):
    name: str = Field(description="Alias clients send as `model`, e.g. `coder`.")
    models: list[GroupMember] = Field(min_length=1, description="Members, with preferences.")


class IndexConfig(_Strict):
    redis_url: str | None = Field(
        None, description="Redis URL for the shared index; None = embedded memory index. "
        "It sits in the Serve config: no password here, use redis_url_env.",
    )
    redis_url_env: str | None = Field(
        None, pattern=ENV_NAME, description="Name of an environment "
        "variable holding the Redis URL (with its password), read by each router and worker "
        "process from its own environment, so the secret never enters Serve's config.",
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

    @model_validator(mode="after")
    def _one_url(self) -> IndexConfig:
        if self.redis_url and self.redis_url_env:
            raise ValueError("set index.redis_url or index.redis_url_env, not both")
        return self

    def resolved(self, environ: Mapping[str, str] | None = None) -> IndexConfig:
        """The config with ``redis_url`` read from ``redis_url_env`` in this process's
        environment; a missing variable fails the replica's start (never a silent memory
        index next to replicas sharing Redis)."""
        if not self.redis_url_env:
            return self
        url = url_from_env("index.redis_url_env", self.redis_url_env, environ)
        return self.model_copy(update={"redis_url": url, "redis_url_env": None})


class LeaseConfig(_Strict):
    """KV retention across an agent's pauses (router.leases): each turn asks its replica to
    keep the session's blocks for about the gap the router expects before the next turn."""

    enabled: bool = Field(True, description="Send leases (engines without them ignore them).")
    quantile: float = Field(0.75, gt=0, le=1, description="The lease covers this quantile of "
                            "the session kind's learned gaps between turns.")
    prior_s: float = Field(30.0, ge=0, description="Lease before a kind has min_samples gaps.")
    min_samples: int = Field(8, ge=1, description="Gaps seen before the learned lease is used.")
    max_s: float = Field(300.0, ge=0, description="Longest lease.")


class PromptCacheConfig(_Strict):
    """Incremental tokenization in each router replica (router.prompt_cache)."""

    enabled: bool = Field(True, description="Keep token ids of rendered-text prefixes, so a "
                          "growing conversation's turn tokenizes only its new part.")
    max_bytes: int = Field(128 << 20, ge=0, description="The cache's bound per router replica "
                           "(least recently used segments go first).")
    offload: bool = Field(True, description="Render and tokenize in a thread pool, off the "
                          "event loop, so a long cold prompt never stalls other streams.")
    threads: int = Field(2, ge=1, le=64, description="Threads of that pool.")
    redis: bool | None = Field(
        None, description="A second level shared by all router replicas: token ids of "
        "prompt prefixes in index.redis_url, so a session new to a replica (a restart, "
        "scale-out) tokenizes only what Redis lacks. None: on when index.redis_url is set.")
    redis_ttl_s: float = Field(3600.0, gt=0, description="How long Redis keeps an entry "
                               "after it was written or last read.")


class RouterConfig(_Strict):
    replicas: int = Field(1, ge=1, description="Router ingress replicas (without autoscaling).")
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Autoscale router replicas (a router holds each request for its "
        "whole stream, so aim target_ongoing_requests high, e.g. 128).",
    )
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests per router replica.")
    max_queued_requests: int = Field(
        256, ge=1, description="Requests Serve's proxy may queue for the routers when every "
        "router replica is at max_ongoing_requests; past it a fast 503 (Serve: unbounded).",
    )
    num_cpus: float = Field(0.0, ge=0, description="CPUs reserved per router replica.")
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="Spread router replicas: at most this many on one node."
    )
    prefill_tokens_per_s: float = Field(
        4000.0, gt=0, description="Initial per-replica prefill rate before one is learned."
    )
    max_retries: int = Field(2, ge=0, description="Retries on the next replica before 1st token.")
    maintenance_s: float = Field(1.0, gt=0, description="How often each router replica purges "
                                 "replicas Serve dropped and pushes its metrics.")
    max_resumes: int = Field(2, ge=0, description="Times a stream cut by a failed replica "
                             "resumes on another (prompt + tokens sent); 0 = end it with an error.")
    first_token_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for a replica to start streaming (queue + "
        "prefill) before the request fails with 503.",
    )
    worker_transport: Literal["grpc", "actor"] = Field(
        "grpc", description="How the router streams from workers: Serve's direct gRPC data "
        "plane (about half the per-call latency) or Ray actor calls (Serve's default).",
    )
    prompt_cache: PromptCacheConfig = Field(
        default_factory=PromptCacheConfig, description="Incremental tokenization.")
    leases: LeaseConfig = Field(default_factory=LeaseConfig,
                                description="KV retention across agents' pauses.")
    policy: str = Field("kvroute", description="A named routing profile (deploy.routing).")
    pipeline: PipelineConfig | None = Field(
        None, description="An explicit pipeline (filters, weighted scorers, picker); "
        "overrides `policy`.",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        profile(v)
        return v

    @field_validator("autoscaling")
    @classmethod
    def _router_scaling(cls, v: AutoscalingConfig | None) -> AutoscalingConfig | None:
        if v is not None and v.policy != "serve-default":
            raise ValueError("router autoscaling supports policy: serve-default only (the "
                             "kvroute policy reads the workers' prefill backlog)")
        return v

    def routing(self) -> PipelineConfig:
        return self.pipeline or profile(self.policy)


class ServerConfig(_Strict):
    host: str = Field("127.0.0.1", description="Bind address; loopback unless configured.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port of the Serve proxy.")
    proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode", description="Where Serve runs HTTP proxies (one per node, or head only)."
    )
    max_body_bytes: int = Field(
        8 << 20, ge=1024, le=1 << 30, description="Largest request body; over it a 413 before "
        "parsing (8 MiB holds a 200k-token conversation as JSON; docs/reliability.md).",
    )
    body_bytes_per_token: int = Field(
        32, ge=1, description="Cheap bound against the context window: a body over the "
        "largest window x this (+1 MiB) is a 413 before parsing or tokenizing.",
    )
    body_read_timeout_s: float = Field(
        60.0, gt=0, description="A request body must arrive within this; a slower one is a "
        "408 (slowloris; 8 MiB at 1 Mbit/s takes 67 s, LAN clients take milliseconds).",
    )
    request_timeout_s: float | None = Field(
        3600.0, gt=0, description="End-to-end deadline of every request, streams included, "
        "enforced by the router itself and by Serve's proxy (http_options): above the "
        "longest generation you serve; None = no limit.",
    )


class ResponsesConfig(_Strict):
    """The Responses API's stored responses (``store: true``, ``previous_response_id``)."""

    store_ttl_s: float = Field(86400.0, gt=0, description="How long a stored response can "
                               "be continued with previous_response_id.")
    max_entry_bytes: int = Field(
        16 << 20, ge=1024, description="Largest stored response (the whole conversation, "
        "compressed); a larger one is served but not stored.",
    )
    memory_bytes: int = Field(
        256 << 20, ge=0, description="Local copies kept per router replica (LRU); the only "
        "store without Redis, the fallback while Redis is unreachable.",
    )


class KvrouteConfig(_Strict):
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


APP_IMPORT_PATH = "deploy.builder:app_builder"


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
