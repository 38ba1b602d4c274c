"""Routing plugins, registered under stable kebab-case names.

Importing this package registers every built-in plugin.
"""

from router.routing.plugins import (  # noqa: F401  (imported to register)
    capacity_filter,
    context_window_filter,
    kv_utilisation_scorer,
    max_score_picker,
    model_cost_scorer,
    model_preference_scorer,
    ongoing_requests_scorer,
    power_of_two_picker,
    prefix_cache_scorer,
    queued_prefill_scorer,
    ray_prefix_affinity_picker,
    round_robin_picker,
    session_affinity_scorer,
    sglang_cache_aware_picker,
    tools_filter,
)
from router.routing.plugins.base import PLUGINS, Filter, Picker, Scorer, make_plugin, register

__all__ = ["PLUGINS", "Filter", "Picker", "Scorer", "make_plugin", "register"]
