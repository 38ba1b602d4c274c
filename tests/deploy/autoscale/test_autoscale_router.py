"""Router replicas under ``server.ingress: direct`` scaled on their listeners' open requests
(``deploy.autoscale.router``), on real ``AutoscalingContext``s built by hand, through
Serve's own wrapper (bounds, delays); and the builder's choice of it."""

from __future__ import annotations

from typing import Any

from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.autoscaling_policy import (
    _apply_autoscaling_config,
    replica_queue_length_autoscaling_policy,
)
from ray.serve.config import AutoscalingConfig as ServeAutoscaling
from ray.serve.config import AutoscalingContext

from deploy.autoscale.router import ONGOING_STAT, RouterOngoingPolicy, open_requests
from deploy.config import AutoscalingConfig
from deploy.serve.builder import _scaling

DEP = DeploymentID(name="kvroute-router", app_name="kvroute")
NOW = 5000.0


def ctx(open_by_replica: dict[str, list[float]], config: ServeAutoscaling, target: int = 1,
        **kw: Any) -> AutoscalingContext:
    """Each replica's reports of its open requests, one a second up to ``NOW``; a replica
    with no reports is running but has not reported yet."""
    running = [ReplicaID(unique_id=r, deployment_id=DEP) for r in open_by_replica]
    per = {rid: [TimeStampedValue(NOW - len(v) + i + 1, x) for i, x in enumerate(v)]
           for rid, v in zip(running, open_by_replica.values(), strict=True) if v}
    return AutoscalingContext(
        deployment_id=DEP, deployment_name=DEP.name, app_name=DEP.app_name,
        current_num_replicas=len(running), target_num_replicas=target,
        running_replicas=running, total_num_requests=0.0, total_queued_requests=0.0,
        aggregated_metrics={}, raw_metrics={ONGOING_STAT: per},
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state=kw.get("state", {}),
        last_scale_up_time=None, last_scale_down_time=None, current_time=NOW, config=config,
    )


def serve_config(**kw: Any) -> ServeAutoscaling:
    base: dict[str, Any] = {"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 0.0,
                            "downscale_delay_s": 0.0, "target_ongoing_requests": 8.0}
    return ServeAutoscaling(**(base | kw))


def test_open_requests_are_each_replicas_mean_summed() -> None:
    c = ctx({"a": [10.0, 20.0, 30.0], "b": [4.0], "c": []}, serve_config())
    assert open_requests(c) == 24.0  # 20 + 4 + 0 (c has not reported)


def test_load_serve_cannot_see_scales_the_routers_up_then_down() -> None:
    config = serve_config()
    busy = ctx({"a": [24.0, 24.0]}, config)
    default, _ = replica_queue_length_autoscaling_policy(busy)  # Serve's count: 0 requests
    assert default <= 1
    policy = _apply_autoscaling_config(RouterOngoingPolicy(target_ongoing_requests=8.0))
    up, _ = policy(busy)
    assert up == 3
    # (Serve's autoscaling state clips the result to min/max_replicas after the policy)
    idle = ctx({"a": [1.0], "b": [0.0], "c": [0.0]}, config, target=3)
    assert policy(idle)[0] == 1
    held = ctx({"a": [1.0], "b": [0.0], "c": [0.0]}, serve_config(downscale_delay_s=600.0),
               target=3)
    assert policy(held)[0] == 3  # idle, but Serve's downscale delay has not passed


def test_the_builder_picks_it_for_direct_routers_only() -> None:
    a = AutoscalingConfig(max_replicas=3, target_ongoing_requests=64.0)
    direct = _scaling(None, a, direct_ingress=True)["autoscaling_config"]
    assert direct.policy.policy_function == "deploy.autoscale.router.RouterOngoingPolicy"
    assert direct.policy.policy_kwargs == {"target_ongoing_requests": 64.0}
    proxied = _scaling(None, a)["autoscaling_config"]
    assert proxied.policy.is_default_policy_function()
