"""Session gaps learned per kind, and the lease each turn carries (router.routing.leases)."""

from __future__ import annotations

import pytest

from deploy.config import LeaseConfig
from router.routing.leases import SessionGaps, session_kind


def test_prior_then_learned_quantile_per_kind_capped() -> None:
    gaps = SessionGaps(LeaseConfig(enabled=True, quantile=0.5, prior_s=30.0, min_samples=3,
                                   max_s=50.0, by_ending=False))
    assert gaps.turn(None, 0.0) == 0.0  # no session: no lease
    assert gaps.turn("s1", 0.0) == 30.0  # nothing learned yet: the prior
    for t in (2.0, 4.0, 6.0):  # gaps of 2 s
        lease = gaps.turn("s1", t)
    assert lease == pytest.approx(2.0)
    assert session_kind("s1#agent:a1") == "sub-agent"
    assert gaps.turn("s1#agent:a1", 7.0) == 30.0  # sub-agents learn apart
    for t in (100.0, 200.0, 300.0, 400.0):  # three gaps of 100 s
        gaps.turn("s2", t)
    assert gaps.lease_s("main") == pytest.approx(50.0)  # median of 2,2,2,100,100,100 capped
    assert SessionGaps(LeaseConfig(enabled=False)).turn("s1", 0.0) == 0.0
    assert SessionGaps(LeaseConfig()).turn("s1", 0.0) == 0.0  # off by default (measured)


def test_by_ending_a_tool_pause_and_a_user_pause_are_learned_apart() -> None:
    gaps = SessionGaps(LeaseConfig(enabled=True, quantile=0.5, prior_s=30.0,
                                   tool_prior_s=5.0, min_samples=3))
    assert gaps.turn("s", 0.0) == 5.0  # sent with the tool-pause prior
    assert gaps.ended("s", 1.0, tool_call=False) == 30.0  # a final answer: the user prior
    assert gaps.ended("nobody", 1.0, tool_call=False) == 0.0
    t = 1.0
    for _ in range(4):  # tool calls followed by 2 s pauses, final answers by 20 s pauses
        gaps.turn("s", t + 20.0)
        assert gaps.ended("s", t + 21.0, tool_call=True) == 0.0  # no renewal
        gaps.turn("s", t + 23.0)
        gaps.ended("s", t + 24.0, tool_call=False)
        t += 24.0
    assert gaps.lease_s("main", "tool") == pytest.approx(2.0)
    assert gaps.lease_s("main", "final") == pytest.approx(20.0)
    assert gaps.turn("s", t + 20.0) == pytest.approx(2.0)  # a turn starts with the short one
    assert gaps.ended("s", t + 21.0, tool_call=False) == pytest.approx(20.0)
    off = SessionGaps(LeaseConfig(enabled=True, by_ending=False))
    off.turn("s", 0.0)
    assert off.ended("s", 1.0, tool_call=False) == 0.0  # no renewals without by_ending
