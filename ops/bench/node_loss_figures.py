"""The node-loss bench's figures from its records: where each request in flight at the kill
ran and how it ended, what requests sent after it saw, and when the replacements served."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ops.bench.harness.client import Record

GROUPS = ("dead_router", "dead_worker", "surviving", "no_headers")


def _group(r: Record, dead_workers: set[str], dead_routers: set[str]) -> str:
    if r.router in dead_routers:
        return "dead_router"
    if r.replica in dead_workers:
        return "dead_worker"
    return "surviving" if r.router else "no_headers"  # failed before any router answered


def _summary(recs: list[Record], kill_s: float) -> dict[str, Any]:
    ends = [r.end_s for r in recs if r.end_s is not None]
    return {"count": len(recs), "errors": sum(not r.ok for r in recs),
            "ended_within_s": None if not ends else round(max(ends) - kill_s, 3),
            "error_samples": sorted({str(r.error)[:120] for r in recs if not r.ok})[:5]}


def classify(records: Sequence[Record], kill_s: float, dead_workers: set[str],
             dead_routers: set[str]) -> dict[str, Any]:
    """``in_flight_at_kill`` by group (``dead_worker``'s ok ones ``migrated``) and
    ``after_kill`` (``surviving_errors``: errors not on the dead node's router or worker)."""
    inflight: dict[str, list[Record]] = {g: [] for g in GROUPS}
    after: list[Record] = []
    for r in records:
        if r.start_s >= kill_s:
            after.append(r)
        elif r.end_s is None or r.end_s > kill_s:
            inflight[_group(r, dead_workers, dead_routers)].append(r)
    out = {g: _summary(recs, kill_s) for g, recs in inflight.items()}
    out["dead_worker"]["migrated"] = sum(r.ok for r in inflight["dead_worker"])
    surviving = [r for r in after if _group(r, dead_workers, dead_routers) != "dead_router"]
    summary = _summary(after, kill_s)
    summary["surviving_errors"] = sum(not r.ok for r in surviving)
    summary["dead_router_errors"] = summary["errors"] - summary["surviving_errors"]
    summary["error_samples"] = sorted({str(r.error)[:120] for r in surviving if not r.ok})[:5]
    return {"in_flight_at_kill": out, "after_kill": summary}


def new_replicas(records: Sequence[Record], readd_s: float, before: set[str],
                 probe_s: float = float("inf")) -> dict[str, Any]:
    """``routed_new_s`` (re-add → the first request a replacement answered was sent: a load
    request, or a fresh-prompt probe sent ``probe_s`` after the re-add) and
    ``requests_to_new`` (load requests the replacements answered)."""
    new = [r for r in records if r.ok and r.replica and r.replica not in before]
    first = min([probe_s, *(r.start_s - readd_s for r in new)])
    return {"routed_new_s": None if first == float("inf") else round(max(0.0, first), 3),
            "requests_to_new": len(new), "new_replicas": sorted({r.replica for r in new})}


def invariants_hold(res: dict[str, Any]) -> bool:
    """No error on the surviving node (in flight or after), the index and the routers drop
    the dead replicas, Serve replaces them and routing uses them."""
    inflight = res["in_flight_at_kill"]
    return (inflight["surviving"]["errors"] == 0 and res["after_kill"]["surviving_errors"] == 0
            and res["index_drop_s"] is not None and res["router_drop_s"] is not None
            and res["replaced_s"] is not None and res["routed_new_s"] is not None)


def markdown(res: dict[str, Any]) -> str:
    """The result as docs/reliability.md shows it."""
    def sec(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f} s"

    inflight, after = res["in_flight_at_kill"], res["after_kill"]
    rows = [("requests / errors", f"{res['requests']} / {res['errors']}")]
    for g in GROUPS:
        s, dead_worker = inflight[g], g == "dead_worker"
        resumed = f", {s['migrated']}" if dead_worker else ""
        rows.append((f"in flight at the kill, {g.replace('_', ' ')}: count, errors"
                     f"{', resumed' if dead_worker else ''}; all ended within",
                     f"{s['count']}, {s['errors']}{resumed}; {sec(s['ended_within_s'])}"))
    rows += [("sent after the kill: count, errors (surviving node / dead router)",
              f"{after['count']}, {after['surviving_errors']} / {after['dead_router_errors']}"),
             ("index drops the dead worker replicas (after kill)", sec(res["index_drop_s"])),
             ("a router's view drops them (after kill)", sec(res["router_drop_s"])),
             ("a router sees the replacement worker (after re-add)", sec(res["replaced_s"])),
             ("Serve healthy at full count again (after re-add)",
              sec(res["serve_healthy_s"])),
             ("first request to a replacement (after re-add); load requests it served",
              f"{sec(res['routed_new_s'])}; {res['requests_to_new']}")]
    lines = ["| figure | value |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines) + f"\n\ninvariants hold: {'yes' if invariants_hold(res) else 'NO'}"
