"""The routing pipeline: filters → weighted scorers → picker.

Filters drop candidates that cannot serve (full or unknown); scorers each give
every candidate a score in [0, 1]; the pipeline sums them with the configured
weights; the picker ranks by total score, ties going to the candidate with fewer
requests in flight, then the one this router has used least (which spreads
unrelated conversations instead of piling them on one replica).
"""

from __future__ import annotations

from collections.abc import Mapping

from router.context import Candidate, RequestContext
from router.plugins import PLUGINS, Scorer

DEFAULT_WEIGHTS: dict[str, float] = {
    "queued-prefill-scorer": 1.0,
    "ongoing-requests-scorer": 0.1,
}


def validate_weights(weights: Mapping[str, float]) -> None:
    unknown = sorted(set(weights) - set(PLUGINS))
    if unknown:
        raise ValueError(f"unknown routing plugins {unknown}; known: {sorted(PLUGINS)}")
    bad = {k: w for k, w in weights.items() if not 0.0 <= w <= 100.0}
    if bad:
        raise ValueError(f"plugin weights must lie in [0, 100]: {bad}")


class Pipeline:
    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        validate_weights(weights)
        self._scorers: list[tuple[Scorer, float]] = [
            (PLUGINS[name](), w) for name, w in weights.items() if w > 0
        ]

    def rank(self, ctx: RequestContext) -> list[Candidate]:
        cands = [c for c in ctx.candidates if c.ongoing < c.max_ongoing] or ctx.candidates
        ctx.candidates = cands
        totals = [0.0] * len(cands)
        for scorer, weight in self._scorers:
            for i, s in enumerate(scorer.score(ctx)):
                totals[i] += weight * s
        order = sorted(
            range(len(cands)),
            key=lambda i: (-round(totals[i], 9), cands[i].ongoing, cands[i].routed, i),
        )
        return [cands[i] for i in order]
