"""Pooling ``bench autoscale`` repeats and reading the autoscaler's goal points from them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ops.bench.autoscale.pool import Pooled, goal_points, pool, quantile


def bench(policy: str, replica_s: float, ttfts: list[float | None]) -> dict[str, Any]:
    return {"policy": policy, "replica_seconds": replica_s, "ttft_target_s": 6.0,
            "ttft_over_time": [[float(i), t] for i, t in enumerate(ttfts)]}


def point(policy: str, replica_s: float, p90: float) -> Pooled:
    return Pooled(policy, 1, 10, 0, replica_s, 1.0, p90, p90, 1.0)


def test_runs_of_one_policy_pool_their_requests_and_average_their_replica_seconds() -> None:
    got = pool([bench("kvroute", 600, [1.0, 2.0, 7.0]), bench("kvroute", 700, [3.0, None]),
                bench("serve-default@1", 500, [1.0])])
    kv = got["kvroute"]
    assert (kv.runs, kv.requests, kv.errors, kv.replica_s) == (2, 5, 1, 650)
    assert kv.p50 == 3.0 and kv.p90 == math.inf  # a failed request is slower than any
    assert kv.within == pytest.approx(3 / 5)
    assert got["serve-default@1"].requests == 1


def test_quantile_interpolates_and_an_infinite_tail_stays_infinite() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert quantile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    assert quantile([1.0, 2.0, math.inf], 0.5) == 2.0
    assert quantile([1.0, math.inf], 0.9) == math.inf


def test_goal_points_read_the_defaults_line_and_a_bound_without_it() -> None:
    # the default: 800 replica-s at p90 6 s, 600 at 8 s (100 replica-s per second of p90)
    hi, lo = point("serve-default@0.75", 800, 6.0), point("serve-default@1", 600, 8.0)
    got = goal_points(point("kvroute", 650, 5.0), hi, lo)
    assert got["b_replica_s_at_equal_p90"] == pytest.approx(650 / 900)
    assert got["b_bound_no_line"] == pytest.approx(650 / 800)
    assert got["a_p90_at_equal_replica_s"] == pytest.approx(5.0 / 7.5)


def test_no_line_is_read_where_more_replicas_gave_a_higher_p90() -> None:
    noisy = goal_points(point("kvroute", 700, 6.25), point("d@0.75", 810, 7.21),
                        point("d@1", 568, 6.54))
    assert math.isnan(noisy["b_replica_s_at_equal_p90"])
    assert noisy["b_bound_no_line"] == pytest.approx(700 / 810)
