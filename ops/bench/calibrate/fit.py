"""The emulator's constants fitted to the curves of ``ops.bench.calibrate.measure``, by
least squares on straight lines (the emulator's own model):

* cold prefill: TTFT(L) = a + L / P. ``prefill_tok_s`` = P; ``prefill_base_s`` = a minus
  the stack's own TTFT (measured on an emulator with no costs), at least 0;
* cached prefix: TTFT(c) = a' + c / R over the cached lengths c (the suffix fixed):
  ``cache_load_tok_s`` = R, or 0 (free) when the longest prefix costs under 0.1 ms;
* decode: step(b) = t + d (b - 1): ``tpot_s`` = t, ``tpot_per_batch_s`` = d (at least 0).

Each fit also reports its line's residuals (``rel_rmse``: RMS residual over the mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ops.bench.calibrate.measure import Point


@dataclass(frozen=True, slots=True)
class Line:
    intercept: float
    slope: float
    rel_rmse: float


def line(points: Sequence[tuple[float, float]]) -> Line:
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    if len(xs) < 2 or np.ptp(xs) == 0:
        return Line(float(ys.mean()) if len(ys) else 0.0, 0.0, 0.0)
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = ys - (intercept + slope * xs)
    mean = float(np.abs(ys).mean()) or 1.0
    return Line(float(intercept), float(slope), float(np.sqrt((resid ** 2).mean())) / mean)


def fit(curves: dict[str, list[Point]], stack_s: float) -> tuple[dict[str, float],
                                                                 dict[str, Line]]:
    """(the emulator's constants, the lines they came from)."""
    cold = line([(p.x - p.cached_tokens, p.seconds) for p in curves["prefill_cold"]])
    hits = [p for p in curves["prefill_cached"] if p.x > 0]
    cached = line([(p.cached_tokens, p.seconds) for p in hits])
    decode = line([(p.x - 1, p.seconds) for p in curves["decode"]])
    span = max((p.cached_tokens for p in hits), default=0.0)
    fitted = {
        "prefill_tok_s": 1.0 / cold.slope if cold.slope > 0 else 1e6,
        "prefill_base_s": max(0.0, cold.intercept - stack_s),
        # free unless taking up the longest cached prefix measured costs 0.1 ms or more
        "cache_load_tok_s": 1.0 / cached.slope if cached.slope * span >= 1e-4 else 0.0,
        "tpot_s": max(0.0, decode.intercept),
        "tpot_per_batch_s": max(0.0, decode.slope),
    }
    return fitted, {"prefill_cold": cold, "prefill_cached": cached, "decode": decode}
