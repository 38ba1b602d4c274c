"""Mooncake traces: loading, ideal reuse and offered prefill load.

Format (one JSON object per line): ``timestamp`` (ms from the trace start),
``input_length`` and ``output_length`` (tokens), ``hash_ids`` (one id per
512-token block of the prompt, the last block possibly partial, chained on the
prefix: the same id at the same position means the same prefix up to there).

Ideal reuse is the share of prompt tokens whose block was seen earlier in the
trace (infinite cache, a partial last block counting its own tokens): an upper
bound on any policy's cached-token ratio.

Offered prefill load is the prefill work the trace brings per second of virtual
time, assuming the ideal reuse, over the fleet's prefill capacity:

    rho = (1 - ideal_reuse) * prompt_tokens * speedup / (span_s * replicas * P)

It depends on the trace and the fleet only, not on a policy, so a speedup chosen
for a target rho is reproducible; a policy that caches less than the ideal sees a
higher real utilisation (each run reports its measured ``prefill_busy``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float  # trace time, before speedup
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: str | Path, max_requests: int | None = None) -> list[TraceRequest]:
    """The trace's requests in arrival order (a stable sort by timestamp)."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if max_requests is not None and len(out) >= max_requests:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            out.append(TraceRequest(
                float(row["timestamp"]) / 1000.0, int(row["input_length"]),
                int(row["output_length"]), tuple(int(h) for h in row["hash_ids"]),
            ))
    out.sort(key=lambda r: r.arrival_s)
    return out


def _block_tokens(req: TraceRequest, i: int, block_size: int) -> int:
    return max(0, min(block_size, req.input_length - i * block_size))


def ideal_reuse(reqs: Sequence[TraceRequest], block_size: int) -> float:
    seen: set[int] = set()
    reused = total = 0
    for r in reqs:
        for i, h in enumerate(r.hash_ids):
            if h in seen:
                reused += _block_tokens(r, i, block_size)
            seen.add(h)
        total += r.input_length
    return reused / total if total else 0.0


def span_s(reqs: Sequence[TraceRequest]) -> float:
    """Trace time from the first to the last arrival (at least 1 ms)."""
    return max(1e-3, reqs[-1].arrival_s - reqs[0].arrival_s) if reqs else 1e-3


def offered_load(
    reqs: Sequence[TraceRequest], speedup: float, replicas: int, prefill_tok_s: float,
    block_size: int,
) -> float:
    work = (1.0 - ideal_reuse(reqs, block_size)) * sum(r.input_length for r in reqs)
    return work * speedup / (span_s(reqs) * replicas * prefill_tok_s)


def speedup_for_load(
    reqs: Sequence[TraceRequest], load: float, replicas: int, prefill_tok_s: float,
    block_size: int,
) -> float:
    """The speedup at which ``offered_load`` equals ``load``."""
    return load / offered_load(reqs, 1.0, replicas, prefill_tok_s, block_size)
