"""Pure builders: validated config → Serve ``Application``.

``app_builder`` is the import path for ``serve run``/``serve deploy`` configs,
whose ``args`` hold the same structure as the kvroute YAML.
"""

from __future__ import annotations

import secrets
import warnings
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import AutoscalingConfig as ServeAutoscaling
from ray.serve.config import AutoscalingPolicy, RequestRouterConfig
from ray.serve.schema import LoggingConfig

from deploy.autoscale.adapter import KvroutePolicy
from deploy.autoscale.router import RouterOngoingPolicy
from deploy.config import AutoscalingConfig, IndexConfig, KvrouteConfig, ModelConfig
from deploy.serve.serve_env import replica_env
from deploy.tracing import tracing_env
from router.app.ingress import Ingress
from router.app.metrics_hub import MetricsHub
from router.app.replica_endpoint import DirectHttp
from router.auth.keys import resolve_for_replicas
from router.dispatch.request_router import KvRequestRouter
from workers.deployment import ModelWorker

ROUTER_DEPLOYMENT = "kvroute-router"
METRICS_DEPLOYMENT = "kvroute-metrics"


def _scaling(fixed: int | None, a: AutoscalingConfig | None,
             direct_ingress: bool = False) -> dict[str, Any]:
    """Serve's replica options; ``direct_ingress``: router replicas that clients reach on
    their own listeners, scaled on their own count (``deploy.autoscale.router``)."""
    if a is None:
        return {"num_replicas": fixed}
    policy = {}
    if a.policy == "kvroute":
        policy = {"policy": AutoscalingPolicy(policy_function=KvroutePolicy, policy_kwargs={
            "ttft_target_s": a.ttft_target_s, "startup_s": a.startup_s})}
    elif direct_ingress:
        policy = {"policy": AutoscalingPolicy(policy_function=RouterOngoingPolicy,
                                              policy_kwargs={"target_ongoing_requests":
                                                             a.target_ongoing_requests})}
    with warnings.catch_warnings():  # Serve deprecates metrics_interval_s for env vars
        warnings.simplefilter("ignore", DeprecationWarning)
        return {"autoscaling_config": ServeAutoscaling(
            min_replicas=a.min_replicas, max_replicas=a.max_replicas,
            target_ongoing_requests=a.target_ongoing_requests,
            upscale_delay_s=a.upscale_delay_s, downscale_delay_s=a.downscale_delay_s,
            metrics_interval_s=a.metrics_interval_s, look_back_period_s=a.look_back_period_s,
            **policy,
        )}


def _spread(max_per_node: int | None) -> dict[str, Any]:
    return {} if max_per_node is None else {"max_replicas_per_node": max_per_node}


def build_worker(m: ModelConfig, index: IndexConfig, direct_token: str | None = None,
                 stream_token: str | None = None) -> Application:
    deployment = serve.deployment(ModelWorker).options(
        name=m.name,
        max_ongoing_requests=m.max_ongoing_requests,
        max_queued_requests=m.max_queued_requests,
        ray_actor_options=_actor_options(m.num_cpus, m.num_gpus),
        request_router_config=RequestRouterConfig(
            request_router_class=KvRequestRouter,
            request_routing_stats_period_s=m.routing_stats_period_s,
        ),
        health_check_period_s=5.0,
        graceful_shutdown_timeout_s=30.0,
        **_scaling(m.num_replicas, m.autoscaling),
        **_spread(m.max_replicas_per_node),
    )
    # The benchmark-only direct endpoint comes in as a class, so workers never import router.
    direct = DirectHttp if m.direct_http else None
    return deployment.bind(m.model_dump(), index.model_dump(), direct,
                           direct_token if m.direct_http else None, stream_token)


def _actor_options(num_cpus: float, num_gpus: float = 0.0) -> dict[str, Any]:
    # replicas on other nodes do not inherit the driver's env
    env = {**replica_env(), **tracing_env()}
    return {"num_cpus": num_cpus, "num_gpus": num_gpus, "runtime_env": _with_env(env)}


def _with_env(env: dict[str, str]) -> dict[str, Any]:
    """The app's runtime_env plus ``env``: an actor's runtime_env replaces the app's."""
    base: dict[str, Any] = {}
    if ray.is_initialized():
        base = dict(ray.get_runtime_context().runtime_env or {})
    return {**base, "env_vars": {**(base.get("env_vars") or {}), **env}}


def build_app(config: KvrouteConfig) -> Application:
    """The app; API keys are resolved here, once: router replicas get digests, never env."""
    config = config.model_copy(
        update={"auth": resolve_for_replicas(config.auth, config.server.host)})
    # direct_http endpoints (benchmarks) need this random token; never logged, readable by
    # key holders in /kvroute/replicas so benchmark tools can call them (docs/reliability.md).
    token = secrets.token_urlsafe(32) if any(m.direct_http for m in config.models) else None
    # router.stream_transport: loopback: workers take router connections with this token
    stream = secrets.token_urlsafe(32) if config.router.stream_transport == "loopback" else None
    workers = {m.name: build_worker(m, config.index, token, stream) for m in config.models}
    hub = serve.deployment(MetricsHub).options(
        name=METRICS_DEPLOYMENT, num_replicas=1, ray_actor_options={"num_cpus": 0},
        # every router replica pushes once a second: no access-log line per push
        logging_config=LoggingConfig(enable_access_log=False),
    ).bind()
    ingress = serve.deployment(Ingress).options(
        name=ROUTER_DEPLOYMENT,
        max_ongoing_requests=config.router.max_ongoing_requests,
        max_queued_requests=config.router.max_queued_requests,
        **_scaling(config.router.replicas, config.router.autoscaling,
                   direct_ingress=config.server.ingress == "direct"),
        ray_actor_options=_actor_options(config.router.num_cpus),
        **_spread(config.router.max_replicas_per_node),
    )
    return ingress.bind(config.model_dump(), workers, hub, token, stream)


def app_builder(args: dict[str, Any]) -> Application:
    """Entry for ``serve run deploy.serve.builder:app_builder`` (args = kvroute config)."""
    return build_app(KvrouteConfig.model_validate(args))
