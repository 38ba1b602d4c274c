"""Admission at the router: late binding, shortest prefill first.

Prefill is FIFO on each replica. Once every candidate replica already has more than
``hold_s`` seconds of prefill queued, dispatching at once only commits the request to
one replica's line. Holding it at the router instead

* keeps the choice open (late binding): when a replica's backlog falls under
  ``hold_s``, the request is routed with the freshest load and cache view, and goes
  where it is best *then*;
* lets the router order the wait. Held requests leave shortest own prefill first
  (uncached tokens / prefill rate at their best candidate): with heavy-tailed prompt
  lengths (agents mix one-line turns with 100k-token contexts) this cuts the mean time
  to first token the way SRPT does, since a short prompt no longer waits behind a
  long one it could have preceded by a fraction of a second.

Aging bounds the cost to long prompts: a request's priority is its own prefill time
minus ``aging`` times its wait so far, so a long prompt overtakes every later short
one after waiting ``(own_long - own_short) / aging``. As all held requests age at the
same rate, the order never changes while they wait: the key is fixed at arrival
(``own + aging * arrival``), and a heap keeps it.

Only exact reports count as backed up (``Candidate.exact_backlog``: the worker measures
the prefill still to do, as the sim and mlx engines do). An engine that reports only an
upper bound (vLLM's front end) or has not reported yet never holds anything: wrongly
holding work from an idle engine would cost throughput, not just latency. A request
never waits longer than ``max_hold_s``, and beyond ``max_held`` waiting requests the
router answers 503 with retry-after, as Serve's own queue bound does. ``hold_s``
defaults to 20 ms, about one router-to-replica hop plus a re-check tick: holding until
a replica is entirely idle would leave it idle for the hop (docs/routing.md has the
sweep: 0 to 100 ms change mean TTFT by a few percent either way).

``HoldQueue`` and the estimates are clock-free and shared with ``kvroute sim``
(``ops/sim/simulator.py``); ``AdmissionGate`` is the asyncio side ``RouterCore`` uses.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from deploy.config.routing import AdmissionParams
from router.errors import ApiError
from router.routing.context import Candidate, RequestContext
from router.routing.estimates import lifetime_rate, queued_now

T = TypeVar("T")


def backlog_s(c: Candidate) -> float:
    """Seconds of prefill queued on ``c`` now (0 unless the replica reports it exactly)."""
    if not c.exact_backlog:
        return 0.0
    r = lifetime_rate(c)
    return queued_now(c, r) / r


def backed_up(cands: Sequence[Candidate], params: AdmissionParams) -> bool:
    """Every candidate has more than ``hold_s`` queued (no candidates: not backed up)."""
    return bool(cands) and min(backlog_s(c) for c in cands) > params.hold_s


def own_prefill_s(ctx: RequestContext) -> float:
    """The request's own prefill time at its cheapest candidate."""
    return min((ctx.uncached(c) / lifetime_rate(c) for c in ctx.candidates), default=0.0)


@dataclass(order=True, slots=True)
class _Held(Generic[T]):
    key: float
    seq: int
    item: T = field(compare=False)


class HoldQueue(Generic[T]):
    """Held requests, highest priority first (smallest own prefill - aging * wait)."""

    def __init__(self, aging: float) -> None:
        self.aging = aging
        self._heap: list[_Held[T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, own_s: float, arrival: float, item: T) -> None:
        heapq.heappush(self._heap, _Held(own_s + self.aging * arrival, next(self._seq), item))

    def peek(self) -> T:
        return self._heap[0].item

    def items(self) -> list[T]:
        return [h.item for h in self._heap]

    def pop(self) -> T:
        return heapq.heappop(self._heap).item


@dataclass(slots=True)
class _Waiter:
    ready: Callable[[], bool]  # the request's own candidates are no longer all backed up
    future: asyncio.Future[None]
    deadline: float


class AdmissionGate:
    """The asyncio side: ``admit`` returns when the request may be dispatched.

    One queue per candidate model set: a request for one model never waits behind
    another model's backlog."""

    def __init__(self, params: AdmissionParams,
                 on_wait: Callable[[float], None] | None = None) -> None:
        self.params = params
        self._queues: dict[tuple[str, ...], HoldQueue[_Waiter]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._on_wait = on_wait

    @property
    def held(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def holding(self, models: tuple[str, ...]) -> bool:
        return bool(self._queues.get(models))

    async def admit(self, models: tuple[str, ...], own_s: float,
                    ready: Callable[[], bool]) -> float:
        """Seconds waited (0: dispatched at once). 503 when too many are held."""
        queue = self._queues.setdefault(models, HoldQueue(self.params.aging))
        if not queue and ready():
            return 0.0
        if self.held >= self.params.max_held:
            raise ApiError(503, "every replica is backed up and the router's queue is full; "
                           "retry later", "overloaded", retry_after_s=1.0)
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiter = _Waiter(ready, loop.create_future(), now + self.params.max_hold_s)
        queue.push(own_s, now, waiter)
        if self._ticker is None or self._ticker.done():
            # not the held request's context: the ticker outlives it and serves them all
            self._ticker = loop.create_task(self._tick(), context=contextvars.Context())
        await waiter.future  # cancelled with the request: the ticker skips it
        waited = loop.time() - now
        if self._on_wait is not None:
            self._on_wait(waited)
        return waited

    def poke(self) -> None:
        """Re-check now (a first token: some replica's backlog just fell)."""
        if self.held:
            self._release(asyncio.get_running_loop().time())

    def _release(self, now: float) -> None:
        """At most one request per queue per call: a released request's load only shows
        once it is dispatched, so releasing more on the same view would release them all."""
        for queue in self._queues.values():
            while queue and queue.peek().future.done():  # cancelled while held, or expired
                queue.pop()
            if not queue:
                continue
            head = queue.peek()
            if now >= head.deadline or head.ready():
                queue.pop().future.set_result(None)
            else:
                self._expire(queue, now)

    @staticmethod
    def _expire(queue: HoldQueue[_Waiter], now: float) -> None:
        """Waiters past ``max_hold_s`` go regardless; popped when they reach the head."""
        for waiter in queue.items():
            if now >= waiter.deadline and not waiter.future.done():
                waiter.future.set_result(None)

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while self.held:
            self._release(loop.time())
            await asyncio.sleep(self.params.tick_s)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for queue in self._queues.values():
            while queue:
                waiter = queue.pop()
                if not waiter.future.done():
                    waiter.future.set_result(None)  # dispatch: never drop what was accepted
