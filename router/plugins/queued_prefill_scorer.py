"""queued-prefill-scorer: estimated time to first token, lower is better.

    est_ttft(c) = (queued prefill tokens on c + this request's uncached tokens on c)
                  / prefill rate of c

The uncached term rewards cache hits; the queue term is the backlog the request
waits behind. This trades hit rate against load in the unit that matters to the
user (seconds) instead of gating affinity on request-count thresholds, which
track the prefill backlog poorly. Score = best estimate / this estimate, in (0, 1].
"""

from __future__ import annotations

from router.context import RequestContext
from router.plugins.base import NoParams, register

_FLOOR_S = 0.005  # decode/dispatch cost even with nothing to prefill


@register("queued-prefill-scorer", "scorer")
class QueuedPrefillScorer:
    def __init__(self, params: NoParams) -> None:
        self.params = params

    def score(self, ctx: RequestContext) -> list[float]:
        est = [
            _FLOOR_S + (c.queued_prefill_tokens + ctx.uncached(c)) / max(c.prefill_tok_s, 1.0)
            for c in ctx.candidates
        ]
        best = min(est, default=_FLOOR_S)
        return [best / e for e in est]
