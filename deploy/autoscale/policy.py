"""The kvroute autoscaling policy: how many replicas keep time to first token under an
objective, as a pure function of a typed snapshot (``decide``). Serve calls it through
the thin adapter in ``deploy.autoscale.adapter``, which then applies Serve's own upscale /
downscale delays and min/max bounds.

The model is fluid, in prefill-seconds (one replica drains one second of prefill work per
second; the workers report their backlog in seconds, so prefill rates never enter here):

- ``b_i``: each running replica's remaining prefill; requests still queued in front of the
  replicas (at the handles) add the mean work per request ``S`` each;
- ``λ``: offered prefill load, prefill-seconds arriving per second (the slope of each
  replica's cumulative work over Serve's look-back window, smoothed over ``RATE_TAU_S``);
- a request's TTFT is its queueing delay plus its own prefill ``S``, so queueing may take
  ``Tq = max(T - S, T / 4)`` of the target ``T``;
- steady state: the router sends each request where its estimated TTFT (queue plus own
  prefill) is least, so the fleet is one queue with ``n`` servers, not ``n`` queues:
  M/M/n (Erlang C) waiting ``C(n, λ) S / (n - λ)`` must stay under ``Tq`` (for ``n = 1``
  this is M/M/1's ``S ρ / (1 - ρ)``; read as ``n`` separate M/M/1 queues it asked for
  twice the replicas at a few seconds of work per request);
- the backlog: a request queued on a replica stays there (an engine does not hand work
  back), so new replicas only take arrivals. An arrival misses the target while every
  replica it could go to has more than ``Tq`` queued. A running replica takes arrivals
  once its own backlog is down to ``Tq`` (now, if it is), a starting one from its learned
  start-up time after it was asked for, a new one after the start-up time; the fleet is
  overloaded while the work on the replicas taking arrivals is above ``Tq`` each. Adding
  a replica is worth it only if it ends that overload sooner than the smaller fleet would
  (by more than a tenth of ``Tq``). So a burst that running or starting replicas will
  absorb before a new one could help does not start one, and neither does one long
  prefill that no other replica could take over.

The answer is the smallest ``n`` meeting both, within the capacity-adjusted bounds; and it
never goes below the current target while any replica's backlog is above ``T``. A tick
with no replica's stats in Serve's window holds the target (read as idle, it reset Serve's
upscale delay mid-burst in ``bench autoscale``); replicas not reported yet are taken to
look like those that did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

SLACK = 0.1  # a replica is worth adding if it ends an overload this share of Tq sooner
STARTUP_ALPHA = 0.5  # weight of a new start-up sample in the learned start-up time
RATE_TAU_S = 2.0  # time constant of the smoothed offered load


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One running replica, from its autoscaling stats (``workers.protocol``)."""

    backlog_s: float  # remaining prefill, seconds
    work_rate: float | None  # offered prefill load, prefill-s per s (None: one point yet)
    request_rate: float | None  # requests begun per second


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the policy sees at one tick (built from Serve's ``AutoscalingContext``)."""

    now: float
    running: tuple[str, ...]  # ids of running replicas
    target: int  # Serve's current target: running + starting
    min_replicas: int  # bounds, adjusted for Serve's target capacity
    max_replicas: int
    loads: dict[str, ReplicaLoad]  # running replicas that have reported
    queued_requests: float = 0.0  # requests waiting at handles for a replica


@dataclass(frozen=True, slots=True)
class Params:
    ttft_target_s: float
    startup_prior_s: float


@dataclass(frozen=True, slots=True)
class State:
    """Carried between ticks: start-up learning."""

    seen: frozenset[str] = frozenset()  # replicas running at the last tick
    pending_since: tuple[float, ...] = ()  # when each starting replica was asked for
    startup_s: float | None = None  # learned start-up time
    rates: tuple[float, float, float] | None = None  # (at, work, requests): smoothed load


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    state: State
    reason: str
    needed: float = field(default=0.0, compare=False)  # before bounds and the hold


def learn_startup(snap: Snapshot, state: State) -> State:
    """Replicas that appeared running since the last tick end the oldest pending starts
    (their start-up time is a sample); then the pending list follows Serve's target."""
    new = [r for r in snap.running if r not in state.seen]
    pending = list(state.pending_since)
    learned = state.startup_s
    for _ in new:
        if not pending:
            break
        sample = max(0.0, snap.now - pending.pop(0))
        learned = sample if learned is None else learned + STARTUP_ALPHA * (sample - learned)
    starting = max(0, snap.target - len(snap.running))
    if len(pending) < starting:
        pending += [snap.now] * (starting - len(pending))
    del pending[starting:]  # the target went down: the newest requests were withdrawn
    return replace(state, seen=frozenset(snap.running), pending_since=tuple(pending),
                   startup_s=learned)


def smooth_rates(now: float, loads: list[ReplicaLoad], running: int, state: State) -> State:
    """The fleet's offered load, smoothed over ``RATE_TAU_S``: a slope over a window of two
    reports a second apart jumps, and a replica with one report has none yet (the others'
    stand for it; with none at all, the last estimate holds)."""
    known = [x for x in loads if x.work_rate is not None and x.request_rate is not None]
    if not known:
        return state
    scale = running / len(known) if running else 1.0
    work = scale * sum(x.work_rate or 0.0 for x in known)
    reqs = scale * sum(x.request_rate or 0.0 for x in known)
    if state.rates is not None:
        at, old_work, old_reqs = state.rates
        a = 1.0 - math.exp(-max(0.0, now - at) / RATE_TAU_S)
        work, reqs = old_work + a * (work - old_work), old_reqs + a * (reqs - old_reqs)
    return replace(state, rates=(now, work, reqs))


def mean_wait(n: int, load: float, service_s: float) -> float:
    """M/M/n mean queueing delay (Erlang C) at ``load`` erlangs (inf: ``load >= n``)."""
    if load >= n:
        return math.inf
    blocked = 1.0  # Erlang B, by its recursion over the servers
    for k in range(1, n + 1):
        blocked = load * blocked / (k + load * blocked)
    waits = n * blocked / (n - load * (1.0 - blocked))  # Erlang C: P(an arrival waits)
    return waits * service_s / (n - load)


def ready_in(snap: Snapshot, state: State, startup_s: float, n: int,
             backlogs: list[float], queue_s: float) -> list[tuple[float, float]]:
    """When each of the first ``n`` replicas takes arrivals, and the work it brings: running
    ones (least ``backlogs`` first) once their own queue is down to ``queue_s``, bringing
    what is left of it; starting ones their start-up time after they were asked for, new
    ones a start-up time, empty. Sorted by time."""
    out = [(max(0.0, b - queue_s), min(b, queue_s)) for b in backlogs[:n]]
    starting = sorted(max(0.0, t + startup_s - snap.now) for t in state.pending_since)
    out += [(t, 0.0) for t in starting[: max(0, n - len(out))]]
    out += [(startup_s, 0.0)] * max(0, n - len(out))
    return sorted(out)


def clear_time(backlog: float, rate: float, ready: list[tuple[float, float]],
               queue_s: float) -> float:
    """Seconds until the work per replica taking arrivals is under ``queue_s`` (inf: never):
    ``backlog`` waits for any replica, ``rate`` arrives, and replicas join at ``ready``
    (sorted ``(time, own work)``), each draining one second of work per second."""
    t, w = 0.0, backlog
    for j, (start, own) in enumerate(ready):
        w = max(0.0, w + (rate - j) * (start - t)) + own  # j replicas served until ``start``
        t, k = start, j + 1
        if w <= queue_s * k:
            return t
        end = ready[j + 1][0] if j + 1 < len(ready) else math.inf
        if k > rate and (cross := t + (w - queue_s * k) / (k - rate)) <= end:
            return cross
    return math.inf


def decide(snap: Snapshot, params: Params, state: State) -> Decision:
    """The replica count for this tick (Serve then applies its delays and bounds)."""
    state = learn_startup(snap, state)
    startup_s = state.startup_s if state.startup_s is not None else params.startup_prior_s
    loads = list(snap.loads.values())
    if snap.running and not loads:  # no report in the window: no news is not idleness
        return Decision(snap.target, state, "no stats from any replica: held")
    # Replicas without a report yet are taken to look like the ones that reported.
    mean = sum(x.backlog_s for x in loads) / len(loads) if loads else 0.0
    backlogs = sorted([x.backlog_s for x in loads]
                      + [mean] * max(0, len(snap.running) - len(loads)))
    state = smooth_rates(snap.now, loads, len(snap.running), state)
    _, rate, req_rate = state.rates or (0.0, 0.0, 0.0)
    work_per_req = rate / req_rate if req_rate > 0 else 0.0
    queued = snap.queued_requests * work_per_req  # at the handles: any replica may take it
    backlog = sum(backlogs) + queued
    target = params.ttft_target_s
    queue_s = max(target - work_per_req, target / 4)
    hi, lo = snap.max_replicas, snap.min_replicas

    def steady(n: int) -> bool:
        if work_per_req <= 0:
            return rate <= n
        return mean_wait(n, rate, work_per_req) <= queue_s

    def clears(n: int) -> float:
        ready = ready_in(snap, state, startup_s, n, backlogs, queue_s)
        return clear_time(queued, rate, ready, queue_s)

    # The fewest replicas that end an overload (almost) as soon as the most could.
    best = clears(hi) + SLACK * queue_s
    needed = next((n for n in range(1, hi + 1) if steady(n) and clears(n) <= best), hi)
    if backlog <= 0 and rate <= 0:
        needed = 0  # idle: down to min_replicas (Serve starts one when a request comes)
    replicas = min(hi, max(lo, needed))
    reason = (f"backlog {backlog:.2f}s (most on one replica {max(backlogs, default=0):.2f}s), "
              f"load {rate:.2f} prefill-s/s, "
              f"{work_per_req:.2f}s/request, start-up {startup_s:.1f}s: {needed} needed")
    if replicas < snap.target and any(x.backlog_s > target for x in loads):
        return Decision(snap.target, state, reason + "; held: a backlog is above target",
                        needed)
    return Decision(replicas, state, reason, needed)
