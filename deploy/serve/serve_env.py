"""Ray Serve's low-latency data path, as environment for Ray's processes.

Ray Serve documents these knobs as part of its "throughput optimized" mode; kvroute takes
all of it but direct ingress (which fixes ports 8000/9000 and drops the proxy):

* in each replica, user code and the handle's router run on the replica's own event loop
  instead of two extra threads, which saves two thread hand-offs per call;
* the proxy calls the router ingress over gRPC instead of Ray actor calls.

Together with the router's gRPC handles to workers (``router.worker_transport``) they
halve the router's added latency on a small machine (docs/benchmarks.md). The replica
knobs go into every kvroute replica's runtime_env (the builder), so ``serve run`` and
``serve deploy`` get them too; the proxy's must be in the environment of each node's Ray
(``kvroute up`` sets it for the Ray it starts; see deploy/cluster.yaml and the KubeRay
manifest). An operator's own setting of any of them wins.
"""

from __future__ import annotations

import os

REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}
PROXY_ENV = {"RAY_SERVE_PROXY_USE_GRPC": "1"}


def _unless_set(defaults: dict[str, str]) -> dict[str, str]:
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def replica_env() -> dict[str, str]:
    """The replica knobs, for a replica's runtime_env."""
    return _unless_set(REPLICA_ENV)


def cluster_env() -> dict[str, str]:
    """Every knob, for the Ray that ``kvroute up`` starts (the proxy inherits it)."""
    return _unless_set({**REPLICA_ENV, **PROXY_ENV})
