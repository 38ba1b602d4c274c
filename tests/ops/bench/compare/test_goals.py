"""``bench compare``'s verdicts (``ops.bench.compare.goals``) on hand-made results: the overhead
goal scales with Serve's own proxy overhead; the peer goals take the better exact peer."""

from __future__ import annotations

from typing import Any

import pytest

from ops.bench.compare.goals import check_goals, overhead_goal


def _bench(p50: float, p99: float, cached: float = 0.8, cpu: float = 0.01) -> dict[str, Any]:
    return {"errors": 0, "requests": 10, "ttft_s": {"p50": p50, "p99": p99},
            "cached_token_ratio": cached, "cpu_s_per_request": cpu}


def test_overhead_goal_is_two_proxy_hops_plus_a_budget() -> None:
    assert overhead_goal({"p50": 0.001, "p99": 0.004}) == pytest.approx({"p50": 0.005,
                                                                         "p99": 0.018})


def test_goals_against_the_peers() -> None:
    result = {"serve_proxy_overhead_s": {"p50": 0.001, "p99": 0.004},
              "router_overhead_s": {"p50": 0.006, "p99": 0.010},
              "routers": {"kvroute": _bench(0.6, 1.5), "dynamo": _bench(1.0, 2.0),
                          "vllm-router": _bench(0.8, 3.0, cached=0.79)}}
    goals = check_goals(result)
    assert goals["zero_errors"] and goals["all_served"]
    assert not goals["overhead_p50"] and goals["overhead_p99"]  # 6 ms > 5 ms; 10 <= 18
    # p50 against the better exact peer (0.8 s): 0.6 > 0.56; p99 against 2.0 s: 1.5 <= 1.6
    assert not goals["p50_vs_exact_peer"] and goals["p99_vs_exact_peer"]
    assert goals["cached_vs_best_peer"] and goals["cpu_vs_best_peer"]
    assert "p50_vs_round_robin" not in goals  # no round-robin run
