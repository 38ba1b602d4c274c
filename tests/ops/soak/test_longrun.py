"""The long soak's analysis on synthetic samples: per-process slopes that survive a killed and
replaced process, the 72-hour extrapolation against the gate's bounds, crashes told apart
from fault victims, the plot, and which failed calls the agent workload retries."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.soak import longrun
from ops.soak.agent import retryable


def _samples(leak_mb_per_h: float, kill_at: int | None = None, n: int = 40) -> list[dict]:
    """Samples a minute apart: a router (leaking), a worker (flat) that a fault kills at
    ``kill_at`` and whose replacement (pid 30) starts at 200 MB."""
    out = []
    for i in range(n):
        t = i * 60.0
        per = {"10 ray::ServeReplica:kvroute:Router": 400 + leak_mb_per_h * t / 3600}
        fds = {"10 ray::ServeReplica:kvroute:Router": 100}
        if kill_at is None or i < kill_at:
            per["20 ray::ServeReplica:kvroute:sim"], fds["20 ray::ServeReplica:kvroute:sim"] = \
                300.0, 50
        else:
            per["30 ray::ServeReplica:kvroute:sim"], fds["30 ray::ServeReplica:kvroute:sim"] = \
                200.0, 40
        out.append({"t_s": t, "per_process": per, "per_process_fds": fds,
                    "redis_mb": 2.0 + (i if kill_at is None or i < kill_at else i - kill_at)})
    return out


def test_a_replaced_process_is_not_a_drop_and_the_leak_is_found() -> None:
    samples = _samples(120.0, kill_at=25)
    fits = longrun.process_fits(samples, "per_process", 0.0)
    assert not fits["20 ray::ServeReplica:kvroute:sim"]["alive_at_end"]
    total = longrun.stack_slope(fits)
    assert total is not None and total["per_h"] == pytest.approx(120.0, abs=1.0)
    x = longrun.extrapolate({"rss_mb": total})["rss_mb"]
    assert x["growth_72h"] == pytest.approx(120 * 72, rel=0.01) and not x["within"]


def test_a_flat_stack_is_within_every_bound() -> None:
    samples = _samples(0.0, kill_at=25)
    growth = {"rss_mb": longrun.stack_slope(longrun.process_fits(samples, "per_process", 0)),
              "fds": longrun.stack_slope(longrun.process_fits(samples, "per_process_fds", 0)),
              "redis_mb": longrun.redis_slope(samples, 0.0, restarts=[25 * 60.0])}
    out = longrun.extrapolate(growth)
    assert set(out) == {"rss_mb", "fds", "redis_mb"}
    assert out["rss_mb"]["within"] and out["fds"]["within"]
    # Redis refills after its restart at 1 MB a minute here: fitted after it, 60 MB/h
    redis = out["redis_mb"]
    assert redis["per_h"] == pytest.approx(60.0, rel=0.01) and not redis["within"]


def test_a_process_gone_without_a_fault_is_a_crash() -> None:
    samples = _samples(0.0, kill_at=25)
    assert longrun.crashes(samples, victims={20}) == []
    crashed = longrun.crashes(samples, victims=set())
    assert [c["pid"] for c in crashed] == [20] and crashed[0]["gone_by_s"] == 25 * 60.0


def test_the_plot_is_written(tmp_path: Path) -> None:
    report = {"samples": _samples(10.0), "faults": [{"t_s": 600.0}], "duration_s": 2400.0}
    path = longrun.plot(report, str(tmp_path / "soak.png"))
    assert path is not None and Path(path).stat().st_size > 10_000


@pytest.mark.parametrize(("error", "again"), [
    ("ClientConnectorError: refused", True), ("ServerDisconnectedError: cut", True),
    ("TimeoutError: ", True), ("HTTP 503: overloaded", True), ("HTTP 429: slow down", True),
    ("HTTP 400: bad", False), ("HTTP 404: no model", False),
])
def test_the_agent_retries_what_the_sdks_retry(error: str, again: bool) -> None:
    assert retryable(error) is again
