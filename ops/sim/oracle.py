"""A lower bound on any policy's TTFT: no queueing at all, and an infinite cache.

A request's TTFT in the emulator is its queueing plus its own prefill of the uncached
tokens. No routing can beat, for every request at once, zero queueing and the largest
hit possible: the longest leading run of its blocks that any earlier request brought
(an infinite cache that never evicts, with blocks usable the moment they arrive). So

    TTFT_i >= max(1, prompt_i - min(hit_i * block_size, prompt_i - 1)) / P

for every request i, and the same holds for the mean and every percentile of the
oracle's TTFTs. If the oracle's p99 is above a goal, no routing policy meets it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ops.sim.trace import TraceRequest


def no_queue_ttft(
    reqs: Sequence[TraceRequest], block_size: int, prefill_tok_s: float
) -> list[float]:
    """Each request's own prefill time at its best achievable hit, in arrival order."""
    seen: set[int] = set()
    out = []
    for r in reqs:
        hit = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            hit += 1
        cached = min(hit * block_size, r.input_length - 1)
        out.append(max(1, r.input_length - cached) / prefill_tok_s)
        seen.update(r.hash_ids)
    return out


def summary(ttft: Sequence[float]) -> dict[str, float]:
    """Mean and percentiles (numpy's default interpolation, as ``ops.sim.report``)."""
    arr = np.asarray(ttft, dtype=float)
    if not len(arr):
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    return {"mean": float(arr.mean()),
            **{f"p{p}": float(np.percentile(arr, p)) for p in (50, 90, 99)}}
