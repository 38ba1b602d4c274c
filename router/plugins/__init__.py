"""Routing plugins, registered under stable kebab-case names.

Importing this package registers every built-in plugin.
"""

from router.plugins import ongoing_requests_scorer, prefix_cache_scorer, queued_prefill_scorer
from router.plugins.base import PLUGINS, Scorer, register

__all__ = [
    "PLUGINS",
    "Scorer",
    "register",
    "ongoing_requests_scorer",
    "prefix_cache_scorer",
    "queued_prefill_scorer",
]
