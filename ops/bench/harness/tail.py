"""Per-request rows of a ``bench compare`` run and where its slowest requests' TTFT goes.

Each router's bench JSON gains ``per_request`` (``columns`` and one row per request, in send
order) and ``ttft_tail`` (the slowest ``TAIL_SHARE`` of its requests, decomposed). The split
uses the sim engine's model (``workers.engines.sim.core``): prefill is FIFO, one request at a time
per
replica, and takes ``uncached / P`` seconds, so on the client's clock

* ``prefill_s`` = (prompt - cached tokens) / P, exact in emulated time;
* ``queue_wait_s``: the request waits until the request before it on the same replica
  (send order) has its first token: ``clamp(first_token(prev) - sent, 0, ttft - prefill)``;
* ``other_s`` = TTFT - queue wait - prefill: the router's own time, the transport both ways
  and the emulator's lateness on a loaded host.

Both derived fields need the replica (the ``x-kvroute-replica`` header the replicas send,
passed on by kvroute, smg and vllm-router; not by Dynamo's frontend) and the prefill rate P;
without them they are None. ``best_other_wait_s``: the least queue wait any other replica
had at the request's send time (hindsight: the last first-token time among the requests
already sent to it), so a tail request that went to a busy replica for its cache shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

import numpy as np

from ops.bench.harness.client import Record

TAIL_SHARE = 0.02  # the slowest 2 % of a run's requests


@dataclass(slots=True)
class RequestRow:
    start_s: float
    ttft_s: float | None
    e2e_s: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    replica: str
    session: str
    error: str | None = None
    prefill_s: float | None = None
    queue_wait_s: float | None = None
    other_s: float | None = None
    best_other_wait_s: float | None = None
    same_replica_as_last_turn: bool | None = None  # None: the session's first request


def request_rows(records: Sequence[Record], prefill_tok_s: float | None) -> list[RequestRow]:
    """One row per record, in send order, with the derived split where it can be made."""
    ordered = sorted(records, key=lambda r: r.start_s)
    rows = [RequestRow(r.start_s, r.ttft_s, r.e2e_s, r.prompt_tokens, r.cached_tokens,
                       r.completion_tokens, r.replica, r.session, r.error) for r in ordered]
    if not prefill_tok_s:
        return rows
    # first-token times of the requests sent so far, per replica (FIFO prefill)
    last_first: dict[str, float] = {r.replica: 0.0 for r in ordered if r.ok and r.replica}
    last_replica: dict[str, str] = {}  # per session
    for rec, row in zip(ordered, rows, strict=True):
        if not rec.ok or not rec.replica or rec.ttft_s is None:
            continue
        if (prev := last_replica.get(rec.session)) is not None:
            row.same_replica_as_last_turn = prev == rec.replica
        last_replica[rec.session] = rec.replica
        row.prefill_s = max(0, rec.prompt_tokens - rec.cached_tokens) / prefill_tok_s
        waits = {k: max(0.0, t - rec.start_s) for k, t in last_first.items()}
        room = max(0.0, rec.ttft_s - row.prefill_s)
        row.queue_wait_s = min(waits[rec.replica], room)
        row.other_s = rec.ttft_s - row.prefill_s - row.queue_wait_s
        others = [w for k, w in waits.items() if k != rec.replica]
        row.best_other_wait_s = min(others) if others else None
        first = rec.start_s + rec.ttft_s
        last_first[rec.replica] = max(last_first[rec.replica], first)
    return rows


def tail_summary(rows: Sequence[RequestRow], share: float = TAIL_SHARE) -> dict[str, float]:
    """Means over the slowest ``share`` of the successful requests (at least one)."""
    ok = sorted((r for r in rows if r.ttft_s is not None and r.error is None),
                key=lambda r: r.ttft_s or 0.0)
    if not ok:
        return {}
    tail = ok[-max(1, round(share * len(ok))):]

    def mean(xs: Sequence[float | None]) -> float:
        vals = [x for x in xs if x is not None]
        return float(np.mean(vals)) if vals else float("nan")

    out = {
        "share": share, "requests": float(len(tail)), "ttft_min_s": tail[0].ttft_s or 0.0,
        "ttft_s": mean([r.ttft_s for r in tail]),
        "prompt_tokens": mean([r.prompt_tokens for r in tail]),
        "uncached_tokens": mean([r.prompt_tokens - r.cached_tokens for r in tail]),
        "cached_ratio": sum(r.cached_tokens for r in tail)
        / max(1, sum(r.prompt_tokens for r in tail)),
    }
    if all(r.queue_wait_s is not None for r in tail):
        rate = [r.prefill_s / max(1, r.prompt_tokens - r.cached_tokens) for r in tail]
        out.update(queue_wait_s=mean([r.queue_wait_s for r in tail]),
                   prefill_s=mean([r.prefill_s for r in tail]),
                   other_s=mean([r.other_s for r in tail]),
                   best_other_wait_s=mean([r.best_other_wait_s for r in tail]),
                   # hindsight: the least-waiting other replica, the whole prompt uncached
                   cold_elsewhere_s=mean([(r.best_other_wait_s or 0.0) + r.prompt_tokens * k
                                          for r, k in zip(tail, rate, strict=True)]),
                   same_replica_share=mean([float(r.same_replica_as_last_turn) for r in tail
                                            if r.same_replica_as_last_turn is not None]),
                   first_turn_share=mean([float(r.same_replica_as_last_turn is None)
                                          for r in tail]))
    return out


def tail_fields(records: Sequence[Record], prefill_tok_s: float | None) -> dict[str, object]:
    """What a router's bench JSON gains: ``per_request`` rows and its ``ttft_tail``."""
    rows = request_rows(records, prefill_tok_s)
    return {"per_request": {"columns": list(COLUMNS), "rows": [_compact(r) for r in rows]},
            "ttft_tail": tail_summary(rows)}


COLUMNS = tuple(f.name for f in fields(RequestRow))


def _compact(row: RequestRow) -> list[object]:
    return [round(v, 4) if isinstance(v, float) else v for v in astuple(row)]
