"""The Serve adapter of the kvroute policy, on real ``AutoscalingContext``s built by hand:
the workers' stats series become the snapshot, Serve's own wrapper applies bounds and
delays around it, and the builder selects it per model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.autoscaling_policy import (
    _apply_autoscaling_config,
    replica_queue_length_autoscaling_policy,
)
from ray.serve.config import AutoscalingConfig as ServeAutoscaling
from ray.serve.config import AutoscalingContext

from deploy.autoscale.adapter import KvroutePolicy, snapshot
from deploy.config import AutoscalingConfig, RouterConfig
from deploy.serve.builder import _scaling
from workers.protocol import AutoscalingStats

DEP = DeploymentID(name="m", app_name="default")
NOW = 5000.0


def rid(name: str) -> ReplicaID:
    return ReplicaID(unique_id=name, deployment_id=DEP)


def series(backlog_s: float, work: tuple[float, float], reqs: tuple[int, int],
           span_s: float = 4.0) -> dict[str, list[TimeStampedValue]]:
    """Two reports ``span_s`` apart: cumulative work and requests went from/to."""
    out: dict[str, list[TimeStampedValue]] = {}
    for t, w, r in ((NOW - span_s, work[0], reqs[0]), (NOW, work[1], reqs[1])):
        stats = AutoscalingStats(backlog_s, w, r, decode_batch=1, kv_usage=0.1)
        for k, v in stats.to_serve().items():
            out.setdefault(k, []).append(TimeStampedValue(t, v))
    return out


def ctx(per_replica: dict[str, dict[str, list[TimeStampedValue]]], target: int,
        requests: float, config: ServeAutoscaling, **kw: Any) -> AutoscalingContext:
    running = [rid(r) for r in per_replica]
    raw: dict[str, dict[ReplicaID, list[TimeStampedValue]]] = {}
    for r, metrics in per_replica.items():
        for name, s in metrics.items():
            raw.setdefault(name, {})[rid(r)] = s
    return AutoscalingContext(
        deployment_id=DEP, deployment_name="m", app_name="default",
        current_num_replicas=len(running), target_num_replicas=target,
        running_replicas=running, total_num_requests=requests, total_queued_requests=0.0,
        aggregated_metrics={}, raw_metrics=raw,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state=kw.get("state", {}),
        last_scale_up_time=None, last_scale_down_time=None, current_time=NOW, config=config,
    )


def serve_config(**kw: Any) -> ServeAutoscaling:
    base: dict[str, Any] = {"min_replicas": 1, "max_replicas": 6, "upscale_delay_s": 0.0,
                            "downscale_delay_s": 0.0, "target_ongoing_requests": 2.0}
    return ServeAutoscaling(**(base | kw))


def test_snapshot_reads_latest_backlog_and_rates_from_the_series() -> None:
    c = ctx({"a": series(3.0, (10.0, 14.0), (5, 13)), "b": {}}, 2, 2.0, serve_config())
    s = snapshot(c)
    assert s.running == ("a", "b") and s.target == 2 and s.now == NOW
    assert set(s.loads) == {"a"}  # b has not reported yet
    load = s.loads["a"]
    assert load.backlog_s == 3.0
    assert load.work_rate == pytest.approx(1.0) and load.request_rate == pytest.approx(2.0)
    one = {k: v[-1:] for k, v in series(3.0, (10.0, 14.0), (5, 13)).items()}
    first = snapshot(ctx({"a": one}, 1, 1.0, serve_config())).loads["a"]
    assert first.backlog_s == 3.0 and first.work_rate is None  # no slope from one report


def test_long_prompts_scale_up_where_the_default_policy_does_not() -> None:
    # Two long prompts on one replica: 2 ongoing requests (the default's target), 9 s of
    # prefill queued against a 2 s TTFT target.
    config = serve_config()
    stats = {"a": series(9.0, (0.0, 9.0), (0, 2))}
    default, _ = replica_queue_length_autoscaling_policy(ctx(stats, 1, 2.0, config))
    assert default == 1
    policy = _apply_autoscaling_config(KvroutePolicy(ttft_target_s=2.0, startup_s=1.0))
    up, _ = policy(ctx(stats, 1, 2.0, config))
    assert up > 1
    capped, _ = policy(ctx(stats, 1, 2.0, serve_config(max_replicas=2)))
    assert capped == 2


def test_serve_delays_apply_around_the_policy() -> None:
    stats = {"a": series(0.0, (5.0, 5.0), (3, 3)), "b": series(0.0, (5.0, 5.0), (3, 3))}
    slow_down = serve_config(downscale_delay_s=600.0)
    policy = _apply_autoscaling_config(KvroutePolicy(ttft_target_s=2.0, startup_s=1.0))
    held, state = policy(ctx(stats, 2, 0.0, slow_down))
    assert held == 2  # idle, but the downscale delay has not passed
    now, _ = policy(ctx(stats, 2, 0.0, serve_config()))
    assert now == 1


def test_builder_selects_the_policy_per_model() -> None:
    kv = _scaling(None, AutoscalingConfig(policy="kvroute", max_replicas=3, ttft_target_s=1.5,
                                          metrics_interval_s=1.0, look_back_period_s=4.0))
    cfg = kv["autoscaling_config"]
    assert cfg.policy.policy_function == "deploy.autoscale.adapter.KvroutePolicy"
    assert cfg.policy.policy_kwargs == {"ttft_target_s": 1.5, "startup_s": 10.0}
    assert (cfg.metrics_interval_s, cfg.look_back_period_s) == (1.0, 4.0)
    default = _scaling(None, AutoscalingConfig(max_replicas=3))["autoscaling_config"]
    assert default.policy.is_default_policy_function()


def test_config_validates_the_policy_at_load() -> None:
    with pytest.raises(ValidationError, match="policy"):
        AutoscalingConfig(policy="ttft")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="look_back_period_s"):
        AutoscalingConfig(metrics_interval_s=5.0, look_back_period_s=5.0)
    with pytest.raises(ValidationError, match="extra"):
        AutoscalingConfig(ttft_target=2.0)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="serve-default only"):
        RouterConfig(autoscaling=AutoscalingConfig(policy="kvroute"))
