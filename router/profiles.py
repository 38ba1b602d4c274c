"""Named routing profiles: pipelines made of registered plugins.

``kvroute`` (the default) minimises estimated time to first token: the queued
prefill backlog plus this request's uncached tokens, over the prefill rate. It
prices a cache hit and a queue in the same unit (seconds) instead of gating
affinity on request-count thresholds, which track the prefill backlog poorly.
A small ongoing-requests term breaks ties toward less decode contention.
"""

from __future__ import annotations

from router.pipeline import PipelineConfig, PluginRef

PROFILES: dict[str, PipelineConfig] = {
    "kvroute": PipelineConfig(scorers=[
        PluginRef(name="queued-prefill-scorer", weight=1.0),
        PluginRef(name="ongoing-requests-scorer", weight=0.1),
    ]),
    "least-loaded": PipelineConfig(scorers=[PluginRef(name="ongoing-requests-scorer")]),
    "prefix-only": PipelineConfig(scorers=[PluginRef(name="prefix-cache-scorer")]),
}


def profile(name: str) -> PipelineConfig:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {sorted(PROFILES)}") from None
