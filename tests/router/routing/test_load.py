"""The router's load view: its own tickets merged with workers' routing stats at their time."""

from __future__ import annotations

import pytest

from router.routing.context import ADMIT_SLACK_S, Candidate, build_candidate
from router.routing.estimates import queued_now
from router.routing.load import LoadTracker, ReplicaLoad
from workers.protocol import LoadStats


def _cand(local: ReplicaLoad, reported: dict[str, float], now: float) -> Candidate:
    return build_candidate("m", "r", matched_blocks=0, block_size=512, local=local,
                           reported=reported, prefill_tok_s=1000.0, now=now)


def _report(ongoing: int, remaining: int, at: float) -> dict[str, float]:
    return LoadStats(ongoing, remaining, 0.0, remaining_prefill_exact=True,
                     taken_at=at).routing_stats()


def test_tracker_keeps_send_times_and_ongoing_history() -> None:
    loads = LoadTracker()
    a = loads.begin("m", "r", 1000, now=1.0)
    b = loads.begin("m", "r", 300, now=2.0)
    view = loads.get("m", "r")
    assert (view.ongoing, view.pending_prefill, view.routed) == (2, 1300, 2)
    assert view.pending_since(0.0) == 1300 and view.pending_since(1.5) == 300
    loads.first_token(a)
    assert view.pending_since(0.0) == 300
    loads.end(a, now=3.0)
    loads.end(a, now=3.5)  # idempotent
    assert [view.ongoing_at(t) for t in (0.5, 1.0, 1.5, 2.5, 3.0, 9.0)] == [0, 1, 1, 2, 1, 1]
    loads.end(b, now=4.0)
    assert (view.ongoing, view.pending_prefill) == (0, 0)
    assert loads.get("m", "gone") == ReplicaLoad()


def test_without_a_report_time_the_larger_view_wins() -> None:
    loads = LoadTracker()
    loads.begin("m", "r", 5000, now=0.0)
    old = {"ongoing_requests": 3, "queued_prefill_tokens": 2000}
    c = _cand(loads.get("m", "r"), old, now=1.0)
    assert (c.ongoing, c.queued_prefill_tokens, c.reported_prefill_tokens) == (3, 5000, 0)


def test_a_report_newer_than_our_requests_replaces_our_pending_estimate() -> None:
    loads = LoadTracker()
    loads.begin("m", "r", 5000, now=0.0)  # its prefill is under way: 1200 tokens left
    c = _cand(loads.get("m", "r"), _report(1, 1200, at=3.8), now=4.0)
    assert c.queued_prefill_tokens == 1200 and c.ongoing == 1
    assert c.reported_prefill_tokens == 1200 and c.report_age_s == pytest.approx(0.2)


def test_requests_sent_after_the_report_are_added_to_it() -> None:
    loads = LoadTracker()
    loads.begin("m", "r", 5000, now=0.0)
    loads.begin("m", "r", 700, now=3.9)  # after the report: the worker has not seen it
    c = _cand(loads.get("m", "r"), _report(1, 1200, at=3.8), now=4.0)
    assert c.queued_prefill_tokens == 1200 + 700 and c.ongoing == 2
    # Sent just before the report: it may not have reached the worker; counted as ours.
    loads.begin("m", "r", 40, now=3.8 - ADMIT_SLACK_S / 2)
    assert _cand(loads.get("m", "r"), _report(2, 1240, at=3.8), now=4.0).queued_prefill_tokens \
        == 1240 + 700 + 40


def test_other_routers_traffic_comes_from_the_report() -> None:
    loads = LoadTracker()
    mine = loads.begin("m", "r", 100, now=0.0)
    loads.end(mine, now=1.0)
    # At 0.5 the worker ran our request and 3 from other routers, 9000 tokens to go.
    c = _cand(loads.get("m", "r"), _report(4, 9000, at=0.5), now=2.0)
    assert c.ongoing == 0 + (4 - 1) and c.queued_prefill_tokens == 9000


def test_an_upper_bound_only_report_does_not_replace_our_estimate() -> None:
    loads = LoadTracker()
    loads.begin("m", "r", 5000, now=0.0)
    vllm_like = LoadStats(1, 8000, 0.0, taken_at=1.0).routing_stats()  # prompt lengths
    c = _cand(loads.get("m", "r"), vllm_like, now=1.5)
    assert c.queued_prefill_tokens == 8000 and c.reported_prefill_tokens == 0
    vllm_like["queued_prefill_tokens"] = 100
    assert _cand(loads.get("m", "r"), vllm_like, now=1.5).queued_prefill_tokens == 5000


def test_the_scorer_drains_the_reported_part_at_the_learned_rate() -> None:
    c = Candidate("m", "r", queued_prefill_tokens=1200 + 700, reported_prefill_tokens=1200,
                  report_age_s=0.5)
    assert queued_now(c, 1000.0) == 700 + 700  # 500 of the reported 1200 done since
    c.report_age_s = 5.0
    assert queued_now(c, 1000.0) == 700  # the report's backlog is gone; ours is behind it
