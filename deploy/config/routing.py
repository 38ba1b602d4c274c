"""The routing section of the config: plugin references, pipelines, admission, and the
named profiles (pipelines made of registered plugins).

Schema only: this module imports nothing from the runtime. A pipeline names its
plugins by their registered kebab-case names; whether those exist and their params are
valid is checked by the plugin registry, which adds itself to ``PLUGIN_CHECKS`` when
``router.routing.pipeline`` is imported (every process that builds or serves routing does), so a
typo still fails when the config is loaded, before anything deploys.

Profiles:
Named routing profiles: pipelines made of registered plugins.

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
up, requests wait at the router and leave shortest-prefill first (router.routing.admission).

The baselines are other systems' published algorithms, each a picker with no
scorers (docs/routing.md): ``round-robin``, ``power-of-two`` (Ray Serve's default),
``sglang-cache-aware`` (SGLang router's cache_aware) and ``ray-prefix-affinity``
(Ray Serve LLM's PrefixCacheAffinityRouter). They learn approximate prefix trees
from their own routing history and never read the index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

PLUGIN_CHECKS: list[Callable[[PipelineConfig], object]] = []


class AdmissionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hold_s: float = Field(0.02, ge=0.0, description="Dispatch at once while some candidate "
                          "replica has at most this much prefill queued (s); else wait here.")
    aging: float = Field(0.5, ge=0.0, description="Priority (s of own prefill) a held "
                         "request gains per second waited; 0 = pure shortest first.")
    tick_s: float = Field(0.02, gt=0.0, le=1.0, description="How often held requests are "
                          "re-checked (also on every first token this router sees).")
    max_hold_s: float = Field(10.0, gt=0.0, description="Longest wait before dispatching "
                              "regardless (a safety valve against stale load reports).")
    max_held: int = Field(1024, ge=1, description="Held requests beyond which new ones "
                          "get 503 with retry-after.")


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
        "backed up, releasing the shortest first (router.routing.admission); None: dispatch at "
        "once.",
    )

    @model_validator(mode="after")
    def _plugins_exist(self) -> PipelineConfig:
        for check in PLUGIN_CHECKS:  # unknown names or bad params fail here, at config time
            check(self)
        return self


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
