"""The soak's judge on synthetic sample series: a steady leak fails, noise and warm-up do not."""

from __future__ import annotations

import argparse
import random

import pytest

from ops.soak.cli import duration, summarize
from ops.soak.probes import growth_per_hour
from ops.soak.workload import Stats, check_reply


def _opts(**overrides: float | None) -> argparse.Namespace:
    base = {"max_rss_growth_mb_per_h": 64.0, "max_fd_growth_per_h": 20.0,
            "max_redis_growth_mb_per_h": None, "max_error_rate": 0.0, "fit_from": 0.5}
    return argparse.Namespace(url="u", model="m", concurrency=1, interval=5.0,
                              **{**base, **overrides})


def _samples(rss_per_h: float, noise_mb: float, n: int = 120, step_s: float = 30.0) -> list[dict]:
    rng = random.Random(0)
    return [{"t_s": i * step_s, "rss_mb": 1500 + rss_per_h * i * step_s / 3600
             + rng.gauss(0, noise_mb), "fds": 800} for i in range(n)]


def _stats(ok: int, failed: int = 0) -> Stats:
    stats = Stats()
    for _ in range(ok):
        stats.record("chat", 0.1, 0.05, None)
    for _ in range(failed):
        stats.record("chat", 0.1, None, "HTTP 500")
    return stats


def test_slope_and_error_recovered() -> None:
    fit = growth_per_hour(_samples(100.0, 2.0), "rss_mb", 0.0)
    assert fit is not None and abs(fit["per_h"] - 100.0) < 3 * fit["stderr_per_h"] + 1
    assert growth_per_hour(_samples(100.0, 2.0)[:2], "rss_mb", 0.0) is None  # too few points


def test_leak_fails_and_noise_passes() -> None:
    leak = summarize(_samples(200.0, 5.0), _stats(100), _opts(), 3600.0)
    assert not leak["passed"] and "rss_mb grows" in leak["violations"][0]
    noisy = summarize(_samples(0.0, 40.0), _stats(100), _opts(), 3600.0)
    assert noisy["passed"], noisy["violations"]


def test_warm_up_before_the_fit_window_is_ignored() -> None:
    samples = _samples(0.0, 1.0)
    for s in samples[:60]:  # a steep first half, flat second half
        s["rss_mb"] -= (60 - s["t_s"] / 30.0) * 20
    assert summarize(samples, _stats(10), _opts(), 3600.0)["passed"]
    assert not summarize(samples, _stats(10), _opts(fit_from=0.0), 3600.0)["passed"]


def test_errors_and_empty_runs_fail() -> None:
    assert summarize(_samples(0, 1), _stats(99, 1), _opts(), 3600.0)["violations"] == [
        "error rate 1.0000% > 0.0000%"]
    assert summarize(_samples(0, 1), _stats(99, 1), _opts(max_error_rate=0.05), 3600)["passed"]
    assert "no request completed" in summarize(_samples(0, 1), Stats(), _opts(), 60.0)["violations"]


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("3m", 180),
                                               ("24h", 86400), ("3d", 259200)])
def test_duration(text: str, seconds: float) -> None:
    assert duration(text) == seconds


def test_reply_checks() -> None:
    assert check_reply("chat", {"choices": [{"message": {"content": "hi"}}]}) == "hi"
    assert check_reply("messages", {"type": "message", "content": [{"text": "a"}]}) == "a"
    with pytest.raises(ValueError):
        check_reply("messages", {"type": "error"})
    with pytest.raises(ValueError):
        check_reply("count_tokens", {"input_tokens": "3"})
