"""Named routing profiles: pipelines made of registered plugins.

``kvroute`` (the default) minimises estimated time to first token plus the delay
the request's own prefill causes to the requests that will queue behind it
(queued-prefill-scorer: T * (1 + lambda * x), see its docstring). It prices a
cache hit and a queue in the same unit (seconds) instead of gating affinity on
request-count thresholds, which track the prefill backlog poorly. A session's
last replica gets a bonus (0.3) while its estimated TTFT stays within ~1.4x the
best; a group's preferred model gets up to 0.5, so a conversation stays on the
model whose cache is warm unless re-prefilling elsewhere costs little. A small
ongoing-requests term breaks ties toward less decode contention. With one model
and no session, only the estimated-TTFT term decides. When every replica is backed
up, requests wait at the router and leave shortest-prefill first (router.admission).

The baselines are other systems' published algorithms, each a picker with no
scorers (docs/routing.md): ``round-robin``, ``power-of-two`` (Ray Serve's default),
``sglang-cache-aware`` (SGLang router's cache_aware) and ``ray-prefix-affinity``
(Ray Serve LLM's PrefixCacheAffinityRouter). They learn approximate prefix trees
from their own routing history and never read the index.
"""

from __future__ import annotations

from router.admission import AdmissionParams
from router.pipeline import PipelineConfig, PluginRef

PROFILES: dict[str, PipelineConfig] = {
    "kvroute": PipelineConfig(
        filters=[PluginRef(name="capacity-filter"), PluginRef(name="context-window-filter"),
                 PluginRef(name="tools-filter")],
        scorers=[
            PluginRef(name="queued-prefill-scorer", weight=1.0),
            PluginRef(name="session-affinity-scorer", weight=0.3),
            PluginRef(name="model-preference-scorer", weight=0.5),
            PluginRef(name="ongoing-requests-scorer", weight=0.1),
        ],
        admission=AdmissionParams(),
    ),
    "least-loaded": PipelineConfig(scorers=[PluginRef(name="ongoing-requests-scorer")]),
    "prefix-only": PipelineConfig(scorers=[PluginRef(name="prefix-cache-scorer")]),
    # Baselines (docs/routing.md): other systems' published algorithms, as pickers.
    "round-robin": PipelineConfig(picker=PluginRef(name="round-robin-picker")),
    "power-of-two": PipelineConfig(picker=PluginRef(name="power-of-two-picker")),
    "sglang-cache-aware": PipelineConfig(picker=PluginRef(name="sglang-cache-aware-picker")),
    "ray-prefix-affinity": PipelineConfig(picker=PluginRef(name="ray-prefix-affinity-picker")),
}


def profile(name: str) -> PipelineConfig:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {sorted(PROFILES)}") from None
