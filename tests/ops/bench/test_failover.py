"""The failover bench's figures (``ops.bench.failover_figures``) and verdict, on hand-made
records: the windows around the kill, the index's and the hit rate's recovery."""

from __future__ import annotations

import pytest

from ops.bench import failover_figures as figures
from ops.bench.failover import goal
from ops.bench.harness.client import Record
from ops.bench.redis_fleet import sentinel_conf


def rec(start_s: float, cached: int, prompt: int = 100, predicted: int = 0,
        error: str | None = None) -> Record:
    return Record("k", "s", start_s, ttft_s=None if error else 0.1, prompt_tokens=prompt,
                  cached_tokens=cached, predicted_cached_tokens=predicted, error=error)


def test_hit_rate_counts_tokens_of_the_requests_that_succeeded() -> None:
    rs = [rec(0, 80), rec(1, 40, prompt=200), rec(2, 100, error="HTTP 500")]
    assert figures.hit_rate(rs) == pytest.approx(120 / 300)
    assert figures.hit_rate([]) is None
    assert figures.predicted_rate([rec(0, 0, predicted=50)]) == 0.5


def test_the_windows_split_the_run_at_the_kill_and_at_the_recovery() -> None:
    w = figures.Windows.around(kill_s=30, recovered_s=34, end_s=90, baseline_s=15)
    assert (w.before, w.during, w.after) == ((15, 30), (30, 34), (34, 90))
    rs = [rec(10, 0), rec(20, 90), rec(31, 10), rec(33, 30), rec(50, 80)]
    assert w.rates(rs) == {"before": 0.9, "during": 0.2, "after": 0.8}  # the 10 s one: outside


def test_an_index_that_never_answers_again_leaves_everything_after_the_kill_during() -> None:
    w = figures.Windows.around(kill_s=30, recovered_s=None, end_s=90, baseline_s=60)
    assert (w.before, w.during, w.after) == ((0, 30), (30, 90), (90, 90))
    assert w.rates([rec(40, 50)])["after"] is None


def test_the_first_prediction_is_the_first_one_sent_after_the_promotion() -> None:
    rs = [rec(29, 90, predicted=80),  # before the promotion: does not count
          rec(31, 0), rec(32, 50, predicted=70, error="HTTP 502"),  # failed: does not count
          rec(32.5, 50, predicted=40), rec(33, 90, predicted=80)]
    assert figures.first_prediction(rs, promotion_s=31.0) == pytest.approx(1.5)
    assert figures.first_prediction(rs[:3], promotion_s=31.0) is None


def test_the_hit_rate_recovers_when_a_whole_window_is_back_within_a_point() -> None:
    before = [rec(t, 90) for t in range(0, 30)]
    dip = [rec(30 + t / 2, 20) for t in range(10)]  # 30 .. 34.5: the index is away
    back = [rec(35 + t / 2, 89.5) for t in range(60)]  # 35 .. 64.5: within a point of 90
    rs = before + dip + back
    got = figures.hit_recovery(rs, kill_s=30, baseline=0.9, window_s=10, step_s=0.5)
    assert got == pytest.approx(5.0)
    # two points under is not back
    low = before + dip + [rec(35 + t / 2, 88) for t in range(60)]
    assert figures.hit_recovery(low, kill_s=30, baseline=0.9, window_s=10) is None


def test_no_dip_is_recovered_at_once_and_a_thin_window_is_not_trusted() -> None:
    rs = [rec(t, 90) for t in range(60)]
    assert figures.hit_recovery(rs, kill_s=30, baseline=0.9) == 0.0
    sparse = [rec(0, 90), rec(31, 90), rec(59, 90)]
    assert figures.hit_recovery(sparse, kill_s=30, baseline=0.9, min_requests=5) is None


def test_the_timeline_has_one_point_per_step() -> None:
    rs = [rec(t, 50) for t in range(20)]
    assert figures.rolling(rs, window_s=10, step_s=5) == [
        (0.0, 0.5, 10), (5.0, 0.5, 10), (10.0, 0.5, 10), (15.0, 0.5, 5)]


@pytest.mark.parametrize(("errors", "index_s", "hit_s", "met"), [
    (0, 1.2, 12.0, True), (1, 1.2, 12.0, False), (0, 2.5, 12.0, False),
    (0, None, 12.0, False), (0, 1.2, 31.0, False), (0, 1.2, None, False)])
def test_the_goal(errors: int, index_s: float | None, hit_s: float | None, met: bool) -> None:
    verdict = goal({"errors": errors, "index_recovery_s": index_s, "hit_recovery_s": hit_s})
    assert all(verdict.values()) is met


def test_the_sentinels_watch_the_primary_with_fast_detection() -> None:
    conf = sentinel_conf(6400, "m")
    assert "sentinel monitor m 127.0.0.1 6400 2\n" in conf
    assert "sentinel down-after-milliseconds m 500\n" in conf
