"""The thin adapter Serve's controller calls each tick: ``AutoscalingContext`` → the typed
``Snapshot`` of ``deploy.autoscale.policy`` → a replica count.

Serve (2.60) instantiates a policy class once per deployment registration with
``AutoscalingPolicy.policy_kwargs``, calls it with an ``AutoscalingContext`` every control
loop tick (0.1 s), and wraps it (``_apply_autoscaling_config``) so that its upscale /
downscale delays and the capacity-adjusted min/max apply to what it returns. The workers'
``record_autoscaling_stats`` values arrive in ``ctx.raw_metrics`` as a time series per
replica over ``look_back_period_s``: the latest point is the backlog now; the slope of the
cumulative counters is the offered load.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from deploy.autoscale.policy import Params, ReplicaLoad, Snapshot, State, decide
from workers.protocol import AutoscalingStats

log = logging.getLogger("ray.serve")  # the controller log, next to its scaling lines


class _Point(Protocol):  # Serve's TimeStampedValue
    timestamp: float
    value: float


def _slope(series: Sequence[_Point]) -> float | None:
    """A cumulative counter's rate over the window; None with fewer than two reports."""
    if len(series) < 2 or series[-1].timestamp <= series[0].timestamp:
        return None
    rise = series[-1].value - series[0].value
    return max(0.0, rise / (series[-1].timestamp - series[0].timestamp))


def replica_load(series: dict[str, Sequence[_Point]]) -> ReplicaLoad | None:
    """One replica's load from its metric series; None before its first full report."""
    latest = AutoscalingStats.from_serve(
        {k: s[-1].value for k, s in series.items() if s})
    if latest is None:
        return None
    work = series[AutoscalingStats.PREFIX + "prefill_work_s"]
    reqs = series[AutoscalingStats.PREFIX + "requests_total"]
    return ReplicaLoad(latest.backlog_s, _slope(work), _slope(reqs))


def snapshot(ctx: Any) -> Snapshot:
    """The typed snapshot of a Serve ``AutoscalingContext``."""
    raw = ctx.raw_metrics or {}
    loads: dict[str, ReplicaLoad] = {}
    running = tuple(r.unique_id for r in ctx.running_replicas)
    for rid in ctx.running_replicas:
        series = {name: per[rid] for name, per in raw.items() if rid in per}
        load = replica_load(series)
        if load is not None:
            loads[rid.unique_id] = load
    return Snapshot(
        now=ctx.current_time, running=running, target=ctx.target_num_replicas,
        min_replicas=ctx.capacity_adjusted_min_replicas,
        max_replicas=ctx.capacity_adjusted_max_replicas,
        loads=loads, queued_requests=float(ctx.total_queued_requests or 0.0),
    )


class KvroutePolicy:
    """Serve's policy callable (``AutoscalingPolicy(policy_function=KvroutePolicy, ...)``).

    The start-up learning lives on the instance: Serve keeps one per registration."""

    def __init__(self, ttft_target_s: float, startup_s: float) -> None:
        self._params = Params(ttft_target_s, startup_s)
        self._state = State()
        self._last: tuple[int, int] | None = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        d = decide(snapshot(ctx), self._params, self._state)
        self._state = d.state
        if self._last != (d.replicas, ctx.target_num_replicas):  # log changes, not ticks
            self._last = (d.replicas, ctx.target_num_replicas)
            log.info("kvroute autoscaling %s: %d -> %d (%s)", ctx.deployment_name,
                     ctx.target_num_replicas, d.replicas, d.reason)
        return d.replicas, {}
