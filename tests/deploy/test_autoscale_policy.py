"""The kvroute autoscaling policy as a pure function of fake snapshots: the backlog term,
the steady-state load term, bounds, the scale-down hold, start-up learning and starting
replicas counted as capacity only once started."""

from __future__ import annotations

import math

import pytest

from deploy.autoscale_policy import (
    Params,
    ReplicaLoad,
    Snapshot,
    State,
    clear_time,
    decide,
    learn_startup,
)

T0 = 1000.0
PARAMS = Params(ttft_target_s=2.0, startup_prior_s=1.0)


def snap(*backlogs: float, target: int | None = None, lo: int = 1, hi: int = 8,
         work_rate: float = 0.0, request_rate: float = 0.0, now: float = T0,
         queued: float = 0.0) -> Snapshot:
    """Running replicas r0.. with these backlogs; the fleet's rates on r0."""
    running = tuple(f"r{i}" for i in range(len(backlogs)))
    loads = {r: ReplicaLoad(b, 0.0, 0.0) for r, b in zip(running, backlogs, strict=True)}
    if running:
        loads["r0"] = ReplicaLoad(backlogs[0], work_rate, request_rate)
    return Snapshot(now, running, len(running) if target is None else target, lo, hi, loads,
                    queued)


def seen(s: Snapshot, startup_s: float | None = None) -> State:
    """State after a tick at which these replicas were already running."""
    return State(frozenset(s.running), (), startup_s)


def test_idle_fleet_goes_to_min() -> None:
    assert decide(snap(0.0, 0.0, 0.0), PARAMS, State()).replicas == 1
    assert decide(snap(0.0, 0.0, lo=0), PARAMS, State()).replicas == 0
    assert decide(snap(0.0, lo=2), PARAMS, State()).replicas == 2


def test_few_long_prompts_scale_up_when_new_replicas_help_in_time() -> None:
    # One replica holds 8 s of prefill (two requests, say): 6 s over the 2 s target.
    # Replicas ready in 1 s: 4 end the overload at once (7 s left over 4 <= 2 s each).
    s = snap(8.0)
    d = decide(s, PARAMS, seen(s))
    assert d.replicas == 4 and "4 needed" in d.reason


def test_backlog_new_replicas_cannot_reach_in_time_does_not_scale() -> None:
    # The same backlog, but a replica takes 30 s to start: the running one is under the
    # target after 6 s, long before a new one could serve.
    s = snap(8.0)
    assert decide(s, PARAMS, seen(s, startup_s=30.0)).replicas == 1


def test_steady_load_sizes_for_utilisation_under_the_target() -> None:
    # 3 prefill-s/s in 6 requests/s: S = 0.5 s, Tq = 1.5 s, rho_max = 0.75 -> 4 replicas.
    s = snap(0.0, 0.0, work_rate=3.0, request_rate=6.0)
    assert decide(s, PARAMS, seen(s)).replicas == 4
    # a looser target tolerates more utilisation: Tq = 9.5 s, rho_max = 0.95 -> 4 (3.16)
    loose = decide(s, Params(10.0, 1.0), seen(s))
    assert loose.replicas == 4
    assert decide(snap(0.0, work_rate=1.0, request_rate=10.0), PARAMS, State()).replicas == 2


def test_queued_requests_count_at_the_mean_work_per_request() -> None:
    # 10 requests queued at handles, 1 s of prefill each, on top of an empty replica.
    s = snap(0.0, work_rate=0.5, request_rate=0.5, queued=10.0)
    assert decide(s, PARAMS, seen(s)).replicas > 1
    assert decide(snap(0.0, work_rate=0.5, request_rate=0.5), PARAMS, State()).replicas == 1


def test_missing_stats_hold_instead_of_reading_as_idle() -> None:
    # Serve's window can hold no report (a replica set change, a late push): that is
    # no information, not an idle fleet, and must not reset Serve's upscale delay.
    s = Snapshot(T0, ("r0", "r1", "r2"), 3, 1, 8, {})
    d = decide(s, PARAMS, seen(s))
    assert d.replicas == 3 and "held" in d.reason
    # one of two replicas reported 3 s: the other is taken to hold as much (6 s in all)
    part = Snapshot(T0, ("r0", "r1"), 2, 1, 8, {"r0": ReplicaLoad(3.0, 0.0, 0.0)})
    whole = snap(3.0, 3.0)
    assert decide(part, PARAMS, seen(part)).needed == decide(whole, PARAMS, seen(whole)).needed


def test_offered_load_is_smoothed_and_kept_when_unknown() -> None:
    s = snap(0.0, 0.0, work_rate=3.0, request_rate=6.0)
    first = decide(s, PARAMS, seen(s))
    assert first.state.rates == (T0, 3.0, 6.0)
    # a jump to 0 one second later moves the estimate by 1 - exp(-1/2), not all the way
    calm = snap(0.0, 0.0, now=T0 + 1)
    _, work, _ = decide(calm, PARAMS, first.state).state.rates or (0, 0, 0)
    assert work == pytest.approx(3.0 * math.exp(-0.5))
    # replicas with one report each (no slope yet): the last estimate holds
    unknown = Snapshot(T0 + 1, ("r0", "r1"), 2, 1, 8,
                       {r: ReplicaLoad(0.0, None, None) for r in ("r0", "r1")})
    held = decide(unknown, PARAMS, first.state)
    assert held.state.rates == first.state.rates and held.replicas == first.replicas


def test_bounds_clip_the_answer() -> None:
    s = snap(40.0, hi=3)
    assert decide(s, PARAMS, seen(s)).replicas == 3
    assert decide(snap(0.0, lo=2, hi=3), PARAMS, State()).replicas == 2
    overloaded = snap(0.0, hi=3, work_rate=10.0, request_rate=10.0)
    assert decide(overloaded, PARAMS, State()).replicas == 3


def test_never_scales_down_while_a_backlog_is_above_target() -> None:
    s = snap(2.5, 0.0, 0.0)  # 2.5 s fits on 2 replicas, but r0's own queue is over 2 s
    d = decide(s, PARAMS, seen(s))
    assert d.replicas == 3 and "held" in d.reason and d.needed == 2
    below = snap(1.9, 0.0, 0.0)
    assert decide(below, PARAMS, seen(below)).replicas == 1


def test_startup_is_learned_from_replicas_that_start() -> None:
    st = learn_startup(snap(0.0, target=3), State())  # two replicas asked for at T0
    assert st.pending_since == (T0, T0) and st.startup_s is None
    two = Snapshot(T0 + 4, ("r0", "r1"), 3, 1, 8, {})
    st = learn_startup(two, st)
    assert st.startup_s == pytest.approx(4.0) and st.pending_since == (T0,)
    three = Snapshot(T0 + 6, ("r0", "r1", "r2"), 3, 1, 8, {})
    st = learn_startup(three, st)
    assert st.startup_s == pytest.approx(5.0) and st.pending_since == ()  # EWMA of 4, 6
    # the target went down while one was starting: its request is withdrawn
    st = learn_startup(Snapshot(T0 + 7, ("r0",), 2, 1, 8, {}), State(frozenset({"r0"}),
                                                                    (T0, T0 + 1), None))
    assert st.pending_since == (T0,)


def test_replicas_present_at_the_first_tick_are_not_startup_samples() -> None:
    st = learn_startup(snap(0.0, 0.0), State())
    assert st.startup_s is None and st.pending_since == ()


def test_starting_replicas_count_as_capacity_once_started() -> None:
    # 8 s on one replica, 3 more asked for 0.5 s ago, start-up learned at 1 s: they serve
    # in 0.5 s and end the overload then, so the policy asks for no more than 4.
    s = snap(8.0, target=4)
    state = State(frozenset({"r0"}), (T0 - 0.5,) * 3, 1.0)
    assert decide(s, PARAMS, state).replicas == 4
    # With a 20 s start-up they will not be serving for 19.5 s: r0 clears its own queue
    # first, and no further replica is started for this backlog (the target holds).
    slow = State(frozenset({"r0"}), (T0 - 0.5,) * 3, 20.0)
    d = decide(s, PARAMS, slow)
    assert d.needed == 1 and d.replicas == 4  # held: r0's backlog is above target


def test_clear_time_fluid_model() -> None:
    assert clear_time(0.0, 0.0, [0.0], 2.0) == 0.0
    assert clear_time(8.0, 0.0, [0.0], 2.0) == pytest.approx(6.0)
    assert clear_time(8.0, 0.0, [0.0, 1.0, 1.0, 1.0], 2.0) == pytest.approx(1.0)
    assert clear_time(8.0, 0.0, [0.0, 1.0, 1.0], 2.0) == pytest.approx(1.0 + 1.0 / 3)
    assert clear_time(1.0, 2.0, [0.0, 0.0], 0.1) == math.inf  # arrivals outpace 2 replicas
    assert clear_time(5.0, 1.0, [2.0], 1.0) == math.inf  # 1 replica, 1 s/s arriving
