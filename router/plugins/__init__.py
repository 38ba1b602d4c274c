"""Routing plugins, registered under stable kebab-case names.

Importing this package registers every built-in plugin.
"""

from router.plugins import (  # noqa: F401  (imported to register)
    capacity_filter,
    max_score_picker,
    ongoing_requests_scorer,
    prefix_cache_scorer,
    queued_prefill_scorer,
)
from router.plugins.base import PLUGINS, Filter, Picker, Scorer, make_plugin, register

__all__ = ["PLUGINS", "Filter", "Picker", "Scorer", "make_plugin", "register"]
