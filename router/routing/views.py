"""Process-local registry of replica views, one per worker deployment.

Lives apart from ``router.dispatch.request_router`` on purpose: Serve pickles a custom
request router's module *by value*, so globals defined there would be private
copies; this module is imported by reference, so the ingress and the router
instances Serve creates share it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    replica: str
    max_ongoing_requests: int
    stats: dict[str, Any]


class ViewSource(Protocol):
    def snapshot(self) -> list[ReplicaInfo]: ...


# The handle call's kwarg that carries the ingress's ranking of replicas (best first), read
# by the Serve request router (``router.dispatch.request_router``) and sent by dispatch and
# pre-warm.
RANK_KWARG = "kvroute_rank"

_SOURCES: dict[str, ViewSource] = {}
_LOCK = threading.Lock()


def register(deployment: str, source: ViewSource) -> None:
    with _LOCK:
        _SOURCES[deployment] = source


def replica_view(deployment: str) -> list[ReplicaInfo]:
    """Live replicas of ``deployment`` as this process's request router sees them."""
    with _LOCK:
        source = _SOURCES.get(deployment)
    return source.snapshot() if source is not None else []
