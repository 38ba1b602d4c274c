"""A served model's section (``models[]``), its engine's kwargs, and model groups.

``MODEL_CHECKS`` lets the runtime's parser registries check the names only they know
(tool-call and reasoning families) when a config loads, without the schema importing
them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

from pydantic import Field, field_validator, model_validator

from deploy.config.autoscale import AutoscalingConfig
from deploy.config.schema import Strict

EngineName = Literal["mlx", "vllm", "sim"]


class MlxKwargs(Strict):
    """``engine_kwargs`` of the mlx engine (None: the engine's own default)."""

    cache_bytes: int | None = Field(None, ge=1 << 20, description="Prefix KV store budget.")
    max_cache_entries: int | None = Field(None, ge=1, description="Prefix KV store entries.")
    prefill_step_size: int | None = Field(None, ge=1, description="Tokens per prefill step.")
    max_batch: int | None = Field(None, ge=1, description="Sequences decoding together.")
    prefill_batch_size: int | None = Field(None, ge=1, description="Prompts prefilled together.")
    disk_bytes: int | None = Field(None, ge=0, description="Disk tier of the prefix KV store "
                                   "(evicted entries spill to files, reloaded on a hit); 0: off.")
    disk_path: str | None = Field(
        None, description="Disk tier folder, kept across restarts: a replica started on it "
        "takes back the same model's entries (default: a temporary folder, removed with the "
        "replica). Replicas on one node may share it: each holds a locked slot-N subfolder.")
    lease_fraction: float | None = Field(None, ge=0, le=1,
                                         description="Most of cache_bytes leases may hold.")


class SimKwargs(Strict):
    """``engine_kwargs`` of the sim engine emulator (None: the emulator's own default)."""

    kv_blocks: int | None = Field(None, ge=1, description="KV capacity in blocks.")
    block_size: int | None = Field(None, ge=1, description="Must equal index.block_size.")
    prefill_tok_s: float | None = Field(None, gt=0, description="Prefill rate (tokens/s).")
    tpot_s: float | None = Field(None, ge=0, description="Decode step at batch 1 (s).")
    tpot_per_batch_s: float | None = Field(None, ge=0, description="Added per extra sequence.")
    vocab_size: int | None = Field(None, ge=1, description="Token ids emitted are below it "
                                   "(default: whole words of the model's own tokenizer).")
    eos_every: int | None = Field(None, ge=0, description="An EOS every N tokens; 0: never.")
    script_path: str | None = Field(
        None, description="Scripted replies (workers/engines/sim/script.py).")
    host_kv_blocks: int | None = Field(None, ge=0, description="Host-tier KV blocks; 0: none.")
    host_reload_tok_s: float | None = Field(None, gt=0, description="Host -> device reload rate.")
    lease_fraction: float | None = Field(None, ge=0, le=1,
                                         description="Most of the KV that leases may hold.")
    prefill_base_s: float | None = Field(None, ge=0, description="Fixed time per prefill (s).")
    cache_load_tok_s: float | None = Field(
        None, ge=0, description="Rate a device-cached prefix is taken up at; 0: free.")
    profile: str | None = Field(
        None, description="A calibrated profile (`kvroute bench calibrate`): a name in "
        "workers/engines/sim/profiles/ or a JSON path; its fitted values are the defaults.")


class VllmKvEvents(Strict):
    """Benchmark only: a sim replica's KV events in vLLM's ZMQ format (workers/vllm_events)."""

    block_size: int = Field(16, ge=1, description="Block size of the events (tokens); must "
                            "divide index.block_size. Give the peer router the same value.")


# vLLM takes its own engine arguments (passed through); kvroute sets these itself.
VLLM_FORCED_ARGS = ("model", "enable_prefix_caching", "kv_events_config")

# Checks the runtime adds for names only it knows (router.output.tool_parsers adds the tool-call
# family check, router.output.reasoning_parsers the reasoning format check, when imported), run
# on each model at load, so a typo fails before deploying.
MODEL_CHECKS: list[Callable[[ModelConfig], object]] = []


class ModelConfig(Strict):
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
        None, description="Reasoning format (router.output.reasoning_parsers, e.g. `qwen3`, "
        "`gpt-oss`); None: detected from the chat template; `none`: no parsing.")
    cost_per_mtok: float = Field(0.0, ge=0.0, description="Relative cost per 1M tokens.")
    direct_http: bool = Field(
        False, description="Also serve each replica's own OpenAI endpoint on 127.0.0.1 "
        "(bypassing the router), e.g. to benchmark other routers over the same replicas; "
        "its POST routes need the deployment's random token (/kvroute/replicas lists it).",
    )
    stream_interval_ms: float = Field(
        0.0, ge=0, le=1000, description="Stream pacing: after a token chunk, the next leaves "
        "a replica no sooner than this, carrying every token released meanwhile (vLLM's "
        "and SGLang's stream_interval, in time). Default 0: every token its own chunk, as "
        "vLLM and SGLang stream by default, so a client's inter-token latency is the "
        "engine's TPOT. The first token and the end are never held, and a stream slower "
        "than the interval is not touched. E.g. 20 (50 chunks/s) saves the worker, the "
        "router and the client a write and a wake-up per token on fast streams, at the "
        "price of chunks of several tokens that benchmarks read as ITL (docs/benchmarks.md, "
        "stream pacing; workers.transport.stream_pacing).",
    )
    default_max_tokens: int = Field(
        1024, ge=1, description="Output limit when a request sets none (capped by context)."
    )
    tool_parser: str | None = Field(
        None, description="Tool-call family (router.output.tool_parsers, e.g. `qwen3-coder`); "
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


class GroupMember(Strict):
    model: str = Field(description="A model of this config.")
    weight: float = Field(1.0, gt=0.0, le=1.0, description="Preference within the group.")


class ModelGroup(Strict):
    name: str = Field(description="Alias clients send as `model`, e.g. `coder`.")
    models: list[GroupMember] = Field(min_length=1, description="Members, with preferences.")
