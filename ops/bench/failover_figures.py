"""The figures of ``kvroute bench failover``, from the run's records and the kill's times
(pure: no Redis, no stack; seconds on the run's clock, records by when they were sent).

* ``hit_rate``: cached / prompt tokens over the requests that succeeded.
* ``Windows``: before = the ``baseline_s`` before the kill, during = kill → the index
  answering again, after = from then to the end.
* ``first_prediction``: promotion → the first request sent after the promotion that came
  back with a non-zero predicted-cached header (a router's local view predicts during the
  outage too, so this bounds the index's return from below).
* ``hit_recovery``: kill → the start of the first rolling window (``window_s`` of requests,
  at least ``min_requests``) whose hit rate is within ``tolerance`` of before's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ops.bench.harness.client import Record


def hit_rate(records: Sequence[Record]) -> float | None:
    done = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(r.cached_tokens for r in done) / prompt if prompt else None


def predicted_rate(records: Sequence[Record]) -> float | None:
    done = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(r.predicted_cached_tokens for r in done) / prompt if prompt else None


def sent_in(records: Sequence[Record], start_s: float, end_s: float) -> list[Record]:
    return [r for r in records if start_s <= r.start_s < end_s]


@dataclass(frozen=True, slots=True)
class Windows:
    before: tuple[float, float]
    during: tuple[float, float]
    after: tuple[float, float]

    @classmethod
    def around(cls, kill_s: float, recovered_s: float | None, end_s: float,
               baseline_s: float) -> Windows:
        """``recovered_s`` None (the index never answered again): all after the kill is during."""
        back = end_s if recovered_s is None else max(kill_s, min(recovered_s, end_s))
        return cls((max(0.0, kill_s - baseline_s), kill_s), (kill_s, back), (back, end_s))

    def rates(self, records: Sequence[Record], predicted: bool = False
              ) -> dict[str, float | None]:
        rate = predicted_rate if predicted else hit_rate
        return {name: _round(rate(sent_in(records, *span)))
                for name, span in (("before", self.before), ("during", self.during),
                                   ("after", self.after))}


def first_prediction(records: Sequence[Record], promotion_s: float) -> float | None:
    """Seconds from the promotion to the first request sent after it whose routing came with a
    prediction (None: no such request)."""
    later = [r.start_s for r in records
             if r.ok and r.start_s >= promotion_s and r.predicted_cached_tokens > 0]
    return min(later) - promotion_s if later else None


def hit_recovery(records: Sequence[Record], kill_s: float, baseline: float, *,
                 window_s: float = 10.0, step_s: float = 0.5, tolerance: float = 0.01,
                 min_requests: int = 5) -> float | None:
    """Seconds from the kill to the first window [t, t + window_s), t >= kill, whose hit rate
    is at least ``baseline - tolerance`` (None: no full window after the kill reaches it)."""
    end = max((r.start_s for r in records), default=0.0)
    t = kill_s
    while t + window_s <= end + 1e-9:
        inside = [r for r in sent_in(records, t, t + window_s) if r.ok]
        rate = hit_rate(inside)
        if len(inside) >= min_requests and rate is not None and rate >= baseline - tolerance:
            return t - kill_s
        t += step_s
    return None


def rolling(records: Sequence[Record], window_s: float = 10.0, step_s: float = 5.0
            ) -> list[tuple[float, float | None, int]]:
    """(window start, hit rate, requests) over the whole run: the JSON's timeline."""
    end = max((r.start_s for r in records), default=0.0)
    out, t = [], 0.0
    while t < end:
        inside = [r for r in sent_in(records, t, t + window_s) if r.ok]
        out.append((round(t, 1), _round(hit_rate(inside)), len(inside)))
        t += step_s
    return out


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)
