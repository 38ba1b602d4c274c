"""``kvroute sim``: the offline routing-policy simulator.

It replays a Mooncake trace through the PRODUCTION routing code (the named
``deploy.config.routing`` profile, candidates built by ``router.routing.context.build_candidate``,
``router.routing.load.LoadTracker`` and the ``MemoryPrefixIndex``) against ``SimCore``
engine EMULATORS in virtual time. See ``simulator`` for the model and
``docs/routing.md`` for the results.
"""

from ops.sim.simulator import SimConfig, SimResult, simulate
from ops.sim.trace import TraceRequest, ideal_reuse, load_trace, offered_load, speedup_for_load

__all__ = [
    "SimConfig",
    "SimResult",
    "TraceRequest",
    "ideal_reuse",
    "load_trace",
    "offered_load",
    "simulate",
    "speedup_for_load",
]
