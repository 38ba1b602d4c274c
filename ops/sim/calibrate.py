"""Find the speedup at which a reference policy keeps prefill RHO busy.

Realised prefill load (``report.prefill_busy``: prefill seconds / (replicas x
arrival window)) depends on the hit rate, hence on the policy, so "85 % busy" needs
a reference. The default is ``sglang-cache-aware``: a published policy, so the
operating point does not move when kvroute's scorer changes, and the baseline
with the highest hit rate on our traces (so kvroute, caching a little less, runs
at a slightly higher load than its reference: the comparison is not tilted our way).

Busy is nearly proportional to the speedup (the hit rate moves little with it), so
a fixed-point iteration S <- S * target / busy(S) converges in a few runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ops.sim.report import prefill_busy
from ops.sim.simulator import SimConfig, simulate
from ops.sim.trace import TraceRequest, speedup_for_load

REFERENCE = "sglang-cache-aware"


def calibrate_speedup(
    trace: Sequence[TraceRequest], cfg: SimConfig, target: float, policy: str = REFERENCE,
    tol: float = 0.005, max_runs: int = 8,
) -> float:
    """A speedup at which ``policy`` runs prefill ``target`` busy (within ``tol``)."""
    speedup = speedup_for_load(trace, target, cfg.replicas, cfg.prefill_tok_s, cfg.block_size)
    for _ in range(max_runs):
        run = dataclasses.replace(cfg, speedup=speedup, policy=policy)
        busy = prefill_busy(simulate(trace, run))
        if abs(busy - target) <= tol or busy <= 0:
            break
        speedup *= target / busy
    return round(speedup, 3)
