"""A deployment's ``autoscaling`` section: Serve's bounds and delays, and which policy
sizes the fleet (``serve-default``, or ``kvroute``: deploy.autoscale.policy).

Schema only: imports no other kvroute package but the schema's own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deploy.config.schema import Strict

AutoscalingPolicyName = Literal["serve-default", "kvroute"]


class AutoscalingConfig(Strict):
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
        "(deploy.autoscale.policy; docs/deploy.md).",
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
