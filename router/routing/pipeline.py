"""The routing pipeline: filters → weighted scorers → picker.

Filters drop candidates that cannot serve; each scorer gives every remaining
candidate a score in [0, 1]; the pipeline sums them with the configured weights;
the picker turns the totals into a ranking (best first). Plugins are named in
config and built from the registry, so a new policy is a new profile, never a
new branch in the router.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from deploy.config.routing import PLUGIN_CHECKS, PipelineConfig, PluginRef
from deploy.tracing import tracer
from router import metrics
from router.routing.context import Candidate, RequestContext
from router.routing.plugins import make_plugin

_TRACER = tracer("kvroute.router")


@contextmanager
def _timed(plugin: str) -> Iterator[None]:
    """A span and a latency sample per plugin (both near free when unobserved)."""
    start = time.perf_counter()
    with _TRACER.start_as_current_span(f"plugin.{plugin}"):
        yield
    metrics.PLUGIN.labels(plugin).observe(time.perf_counter() - start)


class Pipeline:
    def __init__(self, config: PipelineConfig) -> None:
        self.filters = [make_plugin(r.name, "filter", r.params) for r in config.filters]
        self.scorers = [
            (make_plugin(r.name, "scorer", r.params), r.weight)
            for r in config.scorers if r.weight > 0
        ]
        self.picker = make_plugin(config.picker.name, "picker", config.picker.params)

    def rank(self, ctx: RequestContext) -> list[Candidate]:
        for f in self.filters:
            with _timed(f.name):
                ctx.candidates = f.filter(ctx)
        totals = [0.0] * len(ctx.candidates)
        for scorer, weight in self.scorers:
            with _timed(scorer.name):
                scores = scorer.score(ctx)
            for i, s in enumerate(scores):  # the Scorer contract is [0, 1]: hold plugins to it
                totals[i] += weight * (min(1.0, max(0.0, s)) if s == s else 0.0)
        with _timed(self.picker.name):
            return self.picker.pick(ctx, totals)

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        """Lets stateful plugins learn from the decision actually taken."""
        for plugin in [*self.filters, *(s for s, _ in self.scorers), self.picker]:
            if hook := getattr(plugin, "on_routed", None):
                hook(ctx, chosen)


PLUGIN_CHECKS.append(Pipeline)  # config validation builds the plugins (deploy.config.routing)
__all__ = ["Pipeline", "PipelineConfig", "PluginRef"]
