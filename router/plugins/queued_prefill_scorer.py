"""queued-prefill-scorer: estimated time to first token plus the delay it causes.

Own time to first token on candidate c (prefill is FIFO on a replica):

    T(c) = (queued prefill tokens on c + this request's uncached tokens on c) / rate(c)

The uncached term rewards cache hits; the queue term is the backlog the request
waits behind: the replica's reported remaining prefill, less what it has done since
the report at its learned rate, plus this router's newer requests (``queued_now``).
This trades hit rate against load in the unit that matters to the user (seconds)
instead of gating affinity on request-count thresholds, which track the prefill
backlog poorly.

Minimising T alone is greedy: it ignores that this request's prefill,
x(c) = uncached(c) / rate(c), also delays every request that later queues behind
it on c. By Little's law (FIFO), the expected number of requests arriving at c
while this one is in its queue is lambda_c * T(c), with lambda_c the arrival rate
per replica; each waits x(c) longer. The cost the scorer minimises is therefore

    cost(c) = T(c) + x(c) * lambda_c * T(c) = T(c) * (1 + lambda_c * x(c))

At low load (lambda_c * x small) it is the plain estimate; as load grows, cache
misses get dearer because more requests pay for them. That keeps conversations on
the replica holding their prefix when it is only a little busier, which keeps the
hit rate (and so the total prefill work) up exactly when the fleet can least afford
extra work. lambda is learned from the decisions this router takes (an EWMA of
the gaps between them, ``arrival_alpha``) and split evenly over the candidates;
with no history it is 0. ``externality: false`` scores T alone.

Learned prefill rate. Replicas report cumulative counters (uncached tokens
prefilled, seconds spent prefilling: ``Candidate.prefill_tokens_total`` and
``prefill_busy_s``). The scorer keeps, per replica, an EWMA (``rate_alpha``) of
the observed rate Δtokens / Δseconds, taking a sample each time at least
``min_sample_s`` of new prefill time has accumulated. Until a replica has
reported that much, the configured prior ``Candidate.prefill_tok_s`` is used; a
counter that goes backwards (a restarted worker) restarts its average. Both are
learned in ``on_routed``, so ``score`` has no side effects.

Score = best cost / this cost, in (0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from router.context import Candidate, RequestContext
from router.plugins.base import register

_FLOOR_S = 0.005  # decode/dispatch cost even with nothing to prefill


class QueuedPrefillParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    externality: bool = Field(True, description="Add the delay caused to later requests.")
    arrival_alpha: float = Field(0.05, gt=0.0, le=1.0, description="EWMA weight, arrival gaps.")
    rate_alpha: float = Field(0.2, gt=0.0, le=1.0, description="EWMA weight, rate samples.")
    min_sample_s: float = Field(0.5, ge=0.0, description="Prefill seconds per rate sample.")


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
        st = self._state.get((c.model, c.replica))
        if st is None or c.prefill_tokens_total < st.tokens or c.prefill_busy_s < st.busy_s:
            st = self._state[(c.model, c.replica)] = _RateState()  # new, or restarted
            self._fleet.get(c.model, {}).pop(c.replica, None)
        d_busy = c.prefill_busy_s - st.busy_s
        if d_busy > 0 and d_busy >= self.min_sample_s:
            sample = (c.prefill_tokens_total - st.tokens) / d_busy
            st.rate = sample if st.rate is None else st.rate + self.alpha * (sample - st.rate)
            st.tokens, st.busy_s = c.prefill_tokens_total, c.prefill_busy_s
            self._fleet.setdefault(c.model, {})[c.replica] = st.rate

    def rate(self, c: Candidate) -> float:
        st = self._state.get((c.model, c.replica))
        if st is not None and st.rate:
            return max(st.rate, 1.0)
        fleet = self._fleet.get(c.model)
        return max(sum(fleet.values()) / len(fleet) if fleet else c.prefill_tok_s, 1.0)


def queued_now(c: Candidate, rate: float) -> float:
    """Prefill tokens queued on ``c`` now: the replica has worked through its reported
    backlog at ``rate`` since the report (FIFO and never idle while it has work), and
    this router's newer requests wait behind that backlog."""
    drained = min(c.reported_prefill_tokens, rate * c.report_age_s)
    return max(0.0, c.queued_prefill_tokens - drained)


class ArrivalRate:
    """Requests per second, from an EWMA of the gaps between routing decisions."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._last: float | None = None
        self._gap: float | None = None

    def observe(self, now: float) -> None:
        if self._last is not None:
            gap = max(0.0, now - self._last)
            self._gap = gap if self._gap is None else self._gap + self.alpha * (gap - self._gap)
        self._last = now if self._last is None else max(self._last, now)

    @property
    def per_s(self) -> float:
        return 1.0 / self._gap if self._gap else 0.0


@register("queued-prefill-scorer", "scorer")
class QueuedPrefillScorer:
    Params = QueuedPrefillParams

    def __init__(self, params: QueuedPrefillParams) -> None:
        self.params = params
        self.rates = PrefillRates(params.rate_alpha, params.min_sample_s)
        self.arrivals = ArrivalRate(params.arrival_alpha)

    def costs(self, ctx: RequestContext) -> list[float]:
        """cost(c) in seconds, as in the module docstring."""
        n = max(1, len(ctx.candidates))
        lam = self.arrivals.per_s / n if self.params.externality else 0.0
        out = []
        for c in ctx.candidates:
            rate = self.rates.rate(c)
            x = ctx.uncached(c) / rate
            own = _FLOOR_S + queued_now(c, rate) / rate + x
            out.append(own * (1.0 + lam * x))
        return out

    def score(self, ctx: RequestContext) -> list[float]:
        cost = self.costs(ctx)
        best = min(cost, default=_FLOOR_S)
        return [best / e for e in cost]

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        self.arrivals.observe(ctx.now)
        for c in ctx.candidates:
            self.rates.observe(c)
