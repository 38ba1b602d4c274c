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

from pydantic import BaseModel, ConfigDict, Field

from router.routing.context import Candidate, RequestContext
from router.routing.estimates import FLOOR_S, PrefillRates, queued_now, ttft_s
from router.routing.plugins.base import register


class QueuedPrefillParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    externality: bool = Field(True, description="Add the delay caused to later requests.")
    arrival_alpha: float = Field(0.05, gt=0.0, le=1.0, description="EWMA weight, arrival gaps.")
    rate_alpha: float = Field(0.2, gt=0.0, le=1.0, description="EWMA weight, rate samples.")
    min_sample_s: float = Field(0.5, ge=0.0, description="Prefill seconds per rate sample.")


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
            own = ttft_s(queued_now(c, rate), ctx.uncached(c), rate)
            out.append(own * (1.0 + lam * x))
        return out

    def score(self, ctx: RequestContext) -> list[float]:
        cost = self.costs(ctx)
        best = min(cost, default=FLOOR_S)
        return [best / e for e in cost]

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        self.arrivals.observe(ctx.now)
        for c in ctx.candidates:
            self.rates.observe(c)
