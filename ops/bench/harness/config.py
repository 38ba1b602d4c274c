"""The benchmarks' one config builder: one model on sim, mlx or vLLM replicas behind
kvroute's router, on loopback, with what a bench varies (replicas or autoscaling, the
engine's settings, direct endpoints and vLLM-format KV events for the peer routers, a
shared Redis index, router replicas, ingress, pre-warm, leases, stream pacing). A field
left ``None`` keeps kvroute's default, so a bench's JSON says only what it changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploy.config import AutoscalingConfig, KvrouteConfig, ModelConfig
    from deploy.config.router import RouterConfig

EngineValue = int | float | str | bool


@dataclass(frozen=True, slots=True)
class StackSpec:
    model: str
    model_path: str
    port: int
    engine: str = "sim"
    replicas: int | None = 1  # None: Serve autoscales (``autoscaling``)
    autoscaling: AutoscalingConfig | None = None
    engine_kwargs: Mapping[str, EngineValue] = field(default_factory=dict)
    num_cpus: float = 0.1
    context_window: int = 131072
    max_ongoing_requests: int = 64
    direct_http: bool = False  # each replica also serves its own OpenAI endpoint
    kv_event_block_size: int | None = None  # publish vLLM-format KV events at this size
    stream_interval_ms: float | None = None
    redis_url: str | None = None  # a shared prefix index; None: the embedded one
    index_namespace: str | None = None
    router_replicas: int | None = None
    ingress: str | None = None
    prewarm: bool | None = None
    leases: bool | None = None


def sim_kwargs(sim: Mapping[str, float]) -> dict[str, EngineValue]:
    """The sim engine's settings as its config takes them (``kv_blocks`` a count)."""
    return {k: int(v) if k == "kv_blocks" else float(v) for k, v in sim.items()}


def build(spec: StackSpec) -> KvrouteConfig:
    from deploy.config import KvrouteConfig, ServerConfig

    top: dict[str, object] = {}
    if spec.redis_url is not None:
        from deploy.config import IndexConfig

        ns = {} if spec.index_namespace is None else {"namespace": spec.index_namespace}
        top["index"] = IndexConfig(redis_url=spec.redis_url, **ns)
    if (router := _router(spec)) is not None:
        top["router"] = router
    server = {} if spec.ingress is None else {"ingress": spec.ingress}
    return KvrouteConfig(models=[_model(spec)],
                         server=ServerConfig(host="127.0.0.1", port=spec.port, **server),
                         **top)  # type: ignore[arg-type]


def _model(spec: StackSpec) -> ModelConfig:
    from deploy.config import ModelConfig, VllmKvEvents

    extra: dict[str, object] = {}
    if spec.autoscaling is not None:
        extra["autoscaling"] = spec.autoscaling
    if spec.kv_event_block_size is not None:
        extra["vllm_kv_events"] = VllmKvEvents(block_size=spec.kv_event_block_size)
    if spec.stream_interval_ms is not None:
        extra["stream_interval_ms"] = spec.stream_interval_ms
    if spec.direct_http:
        extra["direct_http"] = True
    return ModelConfig(
        name=spec.model, engine=spec.engine, model_path=spec.model_path,  # type: ignore[arg-type]
        num_replicas=spec.replicas, num_cpus=spec.num_cpus,
        engine_kwargs=dict(spec.engine_kwargs), context_window=spec.context_window,
        max_ongoing_requests=spec.max_ongoing_requests, **extra)  # type: ignore[arg-type]


def _router(spec: StackSpec) -> RouterConfig | None:
    from deploy.config.router import LeaseConfig, PrewarmConfig, RouterConfig

    fields: dict[str, object] = {}
    if spec.router_replicas is not None:
        fields["replicas"] = spec.router_replicas
    if spec.prewarm is not None:
        fields["prewarm"] = PrewarmConfig(enabled=spec.prewarm)
    if spec.leases is not None:
        fields["leases"] = LeaseConfig(enabled=spec.leases)
    return RouterConfig(**fields) if fields else None  # type: ignore[arg-type]
