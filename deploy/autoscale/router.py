"""Router replicas scaled on the requests open on their own listeners
(``server.ingress: direct`` with ``router.autoscaling``).

Serve's default policy counts the requests its proxy and handles give a replica. With
``direct`` the clients connect to the router replicas themselves, so Serve would count
none and never scale. So each router replica reports the HTTP requests open on its
listener (``ONGOING_STAT``, from ``Ingress.record_autoscaling_stats``), and this policy is
Serve's default on that count: each replica's mean over ``look_back_period_s``, summed,
over ``target_ongoing_requests``. Serve's wrapper applies the delays, the scaling factors
and the bounds to what it returns, as it does for its own policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from router.app.listener import ONGOING_STAT


class _Point(Protocol):  # Serve's TimeStampedValue
    timestamp: float
    value: float


def _mean(series: Sequence[_Point]) -> float:
    return sum(p.value for p in series) / len(series) if series else 0.0


def open_requests(ctx: Any) -> float:
    """The running router replicas' open requests (a replica yet to report counts 0)."""
    per_replica = (ctx.raw_metrics or {}).get(ONGOING_STAT, {})
    return sum(_mean(per_replica.get(rid, ())) for rid in ctx.running_replicas)


class RouterOngoingPolicy:
    """Serve's policy callable (``AutoscalingPolicy(policy_function=RouterOngoingPolicy)``)."""

    def __init__(self, target_ongoing_requests: float) -> None:
        self._target = target_ongoing_requests

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        if not ctx.running_replicas:  # starting: keep Serve's target
            return ctx.target_num_replicas, {}
        return open_requests(ctx) / self._target, {}
