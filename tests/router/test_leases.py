"""Session gaps learned per kind, and the lease each turn carries (router.leases)."""

from __future__ import annotations

import pytest

from deploy.config import LeaseConfig
from router.leases import SessionGaps, session_kind


def test_prior_then_learned_quantile_per_kind_capped() -> None:
    gaps = SessionGaps(LeaseConfig(quantile=0.5, prior_s=30.0, min_samples=3, max_s=50.0))
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
