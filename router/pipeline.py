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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deploy.tracing import tracer
from router import metrics
from router.admission import AdmissionParams
from router.context import Candidate, RequestContext
from router.plugins import make_plugin

_TRACER = tracer("kvroute.router")


@contextmanager
def _timed(plugin: str) -> Iterator[None]:
    """A span and a latency sample per plugin (both near free when unobserved)."""
    start = time.perf_counter()
    with _TRACER.start_as_current_span(f"plugin.{plugin}"):
        yield
    metrics.PLUGIN.labels(plugin).observe(time.perf_counter() - start)


class PluginRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Registered kebab-case plugin name.")
    weight: float = Field(1.0, ge=0.0, le=100.0, description="Scorer weight (scorers only).")
    params: dict[str, Any] = Field(default_factory=dict, description="The plugin's typed params.")


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    filters: list[PluginRef] = Field(
        default_factory=lambda: [PluginRef(name="capacity-filter")],
        description="Filters, applied in order.",
    )
    scorers: list[PluginRef] = Field(default_factory=list, description="Weighted scorers.")
    picker: PluginRef = Field(
        default_factory=lambda: PluginRef(name="max-score-picker"),
        description="Turns total scores into a ranking.",
    )
    admission: AdmissionParams | None = Field(
        None, description="Hold requests at the router while every candidate replica is "
        "backed up, releasing the shortest first (router.admission); None: dispatch at once.",
    )

    @model_validator(mode="after")
    def _plugins_exist(self) -> PipelineConfig:
        Pipeline(self)  # unknown names or bad params fail here, at config time
        return self


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
            for i, s in enumerate(scores):
                totals[i] += weight * s
        with _timed(self.picker.name):
            return self.picker.pick(ctx, totals)

    def on_routed(self, ctx: RequestContext, chosen: Candidate) -> None:
        """Lets stateful plugins learn from the decision actually taken."""
        for plugin in [*self.filters, *(s for s, _ in self.scorers), self.picker]:
            if hook := getattr(plugin, "on_routed", None):
                hook(ctx, chosen)
