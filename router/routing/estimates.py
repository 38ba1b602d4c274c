"""Prefill-rate and time-to-first-token estimates: one place for the scorer, admission and
session affinity.

A replica's prefill rate is learned from the cumulative counters its worker reports
(``PrefillRates``, an EWMA of rate samples, for the queued-prefill scorer) or read as
its lifetime average (``lifetime_rate``, for admission's backlog test); before either
exists, the configured prior (``Candidate.prefill_tok_s``). Queued prefill drains at
that rate between reports (``queued_now``). A TTFT estimate is the floor plus the
queue plus the request's own uncached prompt, all at one rate (``ttft_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.routing.context import Candidate

FLOOR_S = 0.005  # decode/dispatch cost even with nothing to prefill
MAX_RATE_REPLICAS = 4096  # replicas whose rates PrefillRates keeps (least recently seen go)


def ttft_s(queued_tokens: float, own_tokens: float, rate: float) -> float:
    """Seconds to the first token: the queue ahead, then this request's own prefill."""
    return FLOOR_S + (queued_tokens + own_tokens) / max(rate, 1.0)


def lifetime_rate(c: Candidate) -> float:
    """The replica's prefill rate: its lifetime average if it reports counters, else the
    configured prior."""
    if c.prefill_busy_s > 0 and c.prefill_tokens_total > 0:
        return c.prefill_tokens_total / c.prefill_busy_s
    return max(c.prefill_tok_s, 1.0)


def queued_now(c: Candidate, rate: float) -> float:
    """Prefill tokens queued on ``c`` now: the replica has worked through its reported
    backlog at ``rate`` since the report (FIFO and never idle while it has work), and
    this router's newer requests wait behind that backlog."""
    drained = min(c.reported_prefill_tokens, rate * c.report_age_s)
    return max(0.0, c.queued_prefill_tokens - drained)


@dataclass(slots=True)
class _RateState:
    tokens: int = 0  # counters at the last sample
    busy_s: float = 0.0
    rate: float | None = None


class PrefillRates:
    """Per-replica prefill rate learned from worker-reported cumulative counters.

    A replica not measured yet (new, or never prefilled) gets the mean learned rate of
    its model's other replicas, and the configured prior only when none is measured:
    with the prior alone, a fleet faster than the prior would make every fresh replica
    look slow, so it would never get the traffic it needs to be measured."""

    def __init__(self, alpha: float, min_sample_s: float) -> None:
        self.alpha, self.min_sample_s = alpha, min_sample_s
        self._state: dict[tuple[str, str], _RateState] = {}
        self._fleet: dict[str, dict[str, float]] = {}  # model -> replica -> learned rate

    def observe(self, c: Candidate) -> None:
        st = self._state.pop((c.model, c.replica), None)  # re-inserted: most recently seen
        if st is None or c.prefill_tokens_total < st.tokens or c.prefill_busy_s < st.busy_s:
            st = _RateState()  # new, or restarted
            self._fleet.get(c.model, {}).pop(c.replica, None)
        self._state[(c.model, c.replica)] = st
        self._bound()
        d_busy = c.prefill_busy_s - st.busy_s
        if d_busy > 0 and d_busy >= self.min_sample_s:
            sample = (c.prefill_tokens_total - st.tokens) / d_busy
            st.rate = sample if st.rate is None else st.rate + self.alpha * (sample - st.rate)
            st.tokens, st.busy_s = c.prefill_tokens_total, c.prefill_busy_s
            self._fleet.setdefault(c.model, {})[c.replica] = st.rate

    def _bound(self) -> None:
        """Replicas come and go (autoscaling, restarts): the least recently seen are
        forgotten past ``MAX_RATE_REPLICAS``, so the state never grows with churn."""
        while len(self._state) > MAX_RATE_REPLICAS:
            model, replica = next(iter(self._state))
            del self._state[(model, replica)]
            fleet = self._fleet.get(model, {})
            fleet.pop(replica, None)
            if not fleet:
                self._fleet.pop(model, None)

    def rate(self, c: Candidate) -> float:
        st = self._state.get((c.model, c.replica))
        if st is not None and st.rate:
            return max(st.rate, 1.0)
        fleet = self._fleet.get(c.model)
        return max(sum(fleet.values()) / len(fleet) if fleet else c.prefill_tok_s, 1.0)
