"""The latency histograms resolve what the engines measure: a median TPOT near 10 ms reads
as 10 ms, not as "between 10 and 20"."""

from __future__ import annotations

from router import metrics


def _bounds(hist: object) -> list[float]:
    return list(hist._upper_bounds)  # type: ignore[attr-defined]  # prometheus_client's own


def test_ttft_and_tpot_have_a_bucket_every_millisecond_below_50_ms() -> None:
    for hist in (metrics.TTFT, metrics.TPOT):
        bounds = _bounds(hist)
        assert all(round(ms / 1000, 6) in bounds for ms in range(1, 51)), hist
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
    assert _bounds(metrics.TTFT)[-2] == 120  # a long queue still lands in a bucket
