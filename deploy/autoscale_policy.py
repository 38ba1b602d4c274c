"""The kvroute autoscaling policy: how many replicas keep time to first token under an
objective, as a pure function of a typed snapshot (``decide``). Serve calls it through
the thin adapter in ``deploy.autoscale_serve``, which then applies Serve's own upscale /
downscale delays and min/max bounds.

The model is fluid, in prefill-seconds (one replica drains one second of prefill work per
second; the workers report their backlog in seconds, so prefill rates never enter here):

- ``B``: the fleet's backlog, the running replicas' remaining prefill plus the requests
  queued in front of them (at the handles) at the mean work per request ``S``;
- ``λ``: offered prefill load, prefill-seconds arriving per second (the slope of each
  replica's cumulative work over Serve's look-back window, smoothed over ``RATE_TAU_S``);
- a request's TTFT is its queueing delay plus its own prefill ``S``, so queueing may take
  ``Tq = max(T - S, T / 4)`` of the target ``T``;
- steady state: with M/M/1 queues a replica at utilisation ρ delays by ``S ρ / (1 - ρ)``
  on average, which stays under ``Tq`` for ``ρ <= Tq / (Tq + S)``: ``n >= λ / ρ_max``;
- the backlog: while the backlog per ready replica is above ``Tq``, arriving requests
  miss the target. A running replica drains from now, a starting one from its learned
  start-up time after it was asked for, a new one after the start-up time; adding one is
  worth it only if it ends that overload sooner than the smaller fleet would (by more
  than a tenth of ``Tq``). So a burst that running or starting replicas will absorb
  before a new one could help does not start one.

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


def ready_in(snap: Snapshot, state: State, startup_s: float, n: int) -> list[float]:
    """Seconds until each of the first ``n`` replicas serves: running ones now, starting
    ones their start-up time after they were asked for, new ones a start-up time."""
    out = [0.0] * min(n, len(snap.running))
    starting = sorted(max(0.0, t + startup_s - snap.now) for t in state.pending_since)
    out += starting[: max(0, n - len(out))]
    out += [startup_s] * max(0, n - len(out))
    return out


def clear_time(backlog: float, rate: float, ready: list[float], queue_s: float) -> float:
    """Seconds until the backlog per ready replica is under ``queue_s`` (inf: never), with
    replicas joining at ``ready`` (sorted), each draining one second of work per second."""
    t, w = 0.0, backlog
    for j, start in enumerate(ready):
        w = max(0.0, w + (rate - j) * (start - t))  # j replicas served until ``start``
        t, k = start, j + 1
        if w <= queue_s * k:
            return t
        end = ready[j + 1] if j + 1 < len(ready) else math.inf
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
    scale = len(snap.running) / len(loads) if snap.running else 1.0
    state = smooth_rates(snap.now, loads, len(snap.running), state)
    _, rate, req_rate = state.rates or (0.0, 0.0, 0.0)
    work_per_req = rate / req_rate if req_rate > 0 else 0.0
    backlog = scale * sum(x.backlog_s for x in loads) + snap.queued_requests * work_per_req
    target = params.ttft_target_s
    queue_s = max(target - work_per_req, target / 4)
    rho_max = queue_s / (queue_s + work_per_req) if work_per_req > 0 else 1.0
    hi, lo = snap.max_replicas, snap.min_replicas

    def clears(n: int) -> float:
        return clear_time(backlog, rate, ready_in(snap, state, startup_s, n), queue_s)

    # The fewest replicas that end an overload (almost) as soon as the most could.
    best = clears(hi) + SLACK * queue_s
    needed = next((n for n in range(1, hi + 1)
                   if rate <= rho_max * n and clears(n) <= best), hi)
    if backlog <= 0 and rate <= 0:
        needed = 0  # idle: down to min_replicas (Serve starts one when a request comes)
    replicas = min(hi, max(lo, needed))
    reason = (f"backlog {backlog:.2f}s, load {rate:.2f} prefill-s/s, "
              f"{work_per_req:.2f}s/request, start-up {startup_s:.1f}s: {needed} needed")
    if replicas < snap.target and any(x.backlog_s > target for x in loads):
        return Decision(snap.target, state, reason + "; held: a backlog is above target",
                        needed)
    return Decision(replicas, state, reason, needed)
