"""Admission at the router: the hold queue's order, the backlog estimate, and the gate."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from router.errors import ApiError
from router.routing.admission import (
    AdmissionGate,
    AdmissionParams,
    HoldQueue,
    backed_up,
    backlog_s,
    own_prefill_s,
)
from router.routing.context import Candidate, RequestContext


def _cand(replica: str, queued: int, exact: bool = True, **kw: float) -> Candidate:
    return Candidate("m", replica, queued_prefill_tokens=queued, prefill_tok_s=1000.0,
                     exact_backlog=exact, reported_prefill_tokens=queued, **kw)  # type: ignore[arg-type]


def test_shortest_first_with_aging() -> None:
    q: HoldQueue[str] = HoldQueue(aging=0.5)
    q.push(5.0, arrival=0.0, item="long")
    q.push(0.1, arrival=1.0, item="short")  # later but shorter: goes first
    q.push(0.1, arrival=1.0, item="short-2")  # equal keys: arrival order
    q.push(0.2, arrival=20.0, item="late")  # the long one has waited 20 s: it goes first now
    assert [q.pop() for _ in range(len(q))] == ["short", "short-2", "long", "late"]


def test_backlog_counts_only_exact_reports_and_drains_with_age() -> None:
    assert backlog_s(_cand("a", 2000)) == pytest.approx(2.0)  # prior rate 1000 tok/s
    assert backlog_s(_cand("a", 2000, exact=False)) == 0.0  # an upper bound never holds
    learned = _cand("a", 2000, prefill_tokens_total=40_000, prefill_busy_s=10.0)
    assert backlog_s(learned) == pytest.approx(0.5)  # 4000 tok/s, its lifetime average
    aged = _cand("a", 2000, report_age_s=1.5)
    assert backlog_s(aged) == pytest.approx(0.5)  # worked 1.5 s since the report
    params = AdmissionParams(hold_s=0.1)
    assert backed_up([_cand("a", 2000), _cand("b", 500)], params)
    assert not backed_up([_cand("a", 2000), _cand("b", 50)], params)
    assert not backed_up([], params)


def test_own_prefill_is_at_the_cheapest_candidate() -> None:
    cands = [Candidate("m", "a", matched_tokens=900, prefill_tok_s=1000.0),
             Candidate("m", "b", prefill_tok_s=1000.0)]
    ctx = RequestContext("r", {"m": 1000}, {"m": []}, 64, cands)
    assert own_prefill_s(ctx) == pytest.approx(0.1)


async def test_gate_holds_until_ready_and_releases_shortest_first() -> None:
    gate = AdmissionGate(AdmissionParams(tick_s=0.01))
    busy = {"m": True}
    order: list[str] = []

    async def request(name: str, own_s: float) -> None:
        await gate.admit(("m",), own_s, lambda: not busy["m"])
        order.append(name)
        busy["m"] = True  # the released request makes the replica busy again

    assert await gate.admit(("other",), 1.0, lambda: True) == 0.0  # ready: no wait
    tasks = [asyncio.create_task(request("long", 5.0))]
    await asyncio.sleep(0.02)
    tasks.append(asyncio.create_task(request("short", 0.1)))
    await asyncio.sleep(0.02)
    assert gate.held == 2 and order == []
    for _ in range(2):
        busy["m"] = False
        gate.poke()  # as a first token does
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["short", "long"] and gate.held == 0


async def test_gate_bounds_the_queue_and_the_wait() -> None:
    gate = AdmissionGate(AdmissionParams(tick_s=0.01, max_hold_s=0.1, max_held=1))
    held = asyncio.create_task(gate.admit(("m",), 1.0, lambda: False))
    await asyncio.sleep(0.02)
    with pytest.raises(ApiError) as info:
        await gate.admit(("m",), 1.0, lambda: False)
    assert info.value.status == 503 and info.value.retry_after_s
    assert 0.1 <= await asyncio.wait_for(held, 2.0) < 1.0  # released by max_hold_s


async def test_cancelled_waiter_is_skipped_and_close_releases_the_rest() -> None:
    gate = AdmissionGate(AdmissionParams(tick_s=0.01))
    gone = asyncio.create_task(gate.admit(("m",), 0.1, lambda: False))
    kept = asyncio.create_task(gate.admit(("m",), 1.0, lambda: False))
    await asyncio.sleep(0.02)
    gone.cancel()  # the client went away while held
    await asyncio.sleep(0.02)
    await gate.close()
    assert await asyncio.wait_for(kept, 1.0) > 0 and gone.cancelled()


async def test_one_release_per_check_so_the_released_load_shows_first() -> None:
    gate = AdmissionGate(AdmissionParams(tick_s=1.0))  # pokes re-check first here
    free = {"m": False}
    waiters = [asyncio.create_task(gate.admit(("m",), 0.1, lambda: free["m"]))
               for _ in range(3)]
    await asyncio.sleep(0.01)
    free["m"] = True  # the view says free, but releasing all three would pile them up
    gate.poke()
    await asyncio.sleep(0.01)
    assert sum(w.done() for w in waiters) == 1 and gate.held == 2
    gate.poke()
    gate.poke()
    await asyncio.gather(*waiters)
    await gate.close()


REQUEST = contextvars.ContextVar("request", default="none")


async def test_the_ticker_runs_in_no_requests_context() -> None:
    """The first held request starts the ticker; it outlives that request and checks
    everyone's, so what it does (pre-warms that ``ready`` starts) must not carry that
    request's logs, spans and Serve request id."""
    gate = AdmissionGate(AdmissionParams(tick_s=0.01))
    seen: list[str] = []

    def ready() -> bool:
        seen.append(REQUEST.get())
        return len(seen) > 1  # held at the first check, released at the ticker's

    REQUEST.set("req-1")
    await asyncio.wait_for(gate.admit(("m",), 1.0, ready), 1.0)
    assert seen == ["req-1", "none"]
