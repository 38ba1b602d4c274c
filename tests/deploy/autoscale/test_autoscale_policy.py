"""The kvroute autoscaling policy as a pure function of fake snapshots: the backlog term,
the steady-state load term, bounds, the scale-down hold, start-up learning and starting
replicas counted as capacity only once started."""

from __future__ import annotations

import math

import pytest

from deploy.autoscale.policy import (
    Params,
    ReplicaLoad,
    Snapshot,
    State,
    clear_time,
    decide,
    learn_startup,
    mean_wait,
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
    # One replica holds 8 s of prefill (two requests, say): arrivals would wait 6 s over
    # the 2 s target. Its queue stays its own, but a replica ready in 1 s takes arrivals
    # from then on: one more ends the overload as soon as any number would.
    s = snap(8.0)
    d = decide(s, PARAMS, seen(s))
    assert d.replicas == 2 and "2 needed" in d.reason


def test_a_replicas_own_queue_is_not_shared_by_new_replicas() -> None:
    # 4 replicas with 10 s queued each, 3 prefill-s/s arriving at 0.5 s each (Tq 1.5 s).
    # New replicas only take arrivals: 2 absorb them from 1 s on, while the 4 work off
    # their queues. Pooling the 40 s over the fleet (as if new replicas drained it too)
    # asked for all 8.
    s = snap(10.0, 10.0, 10.0, 10.0, work_rate=3.0, request_rate=6.0)
    assert decide(s, PARAMS, seen(s)).replicas == 6
    # one long prefill on one replica, the others idle: arrivals go to the idle ones
    one = snap(0.0, 0.0, 0.0, 15.0, work_rate=0.5, request_rate=0.5)
    d = decide(one, Params(6.0, 2.0), seen(one))
    assert d.needed == 1 and d.replicas == 4  # held only while that backlog is over T


def test_steady_load_is_one_queue_over_the_fleet() -> None:
    # A tick from bench autoscale's controller log: no backlog, 2.03 prefill-s/s at
    # 4.29 s per request, target 6 s (Tq 1.71 s). As 8 M/M/1 queues (rho <= 0.285) that
    # asked for 8 replicas; the router's least-TTFT choice makes one M/M/n queue, where
    # 4 replicas wait 0.39 s on average and 3 wait 2.03 s.
    s = snap(0.0, 0.0, work_rate=2.03, request_rate=2.03 / 4.29)
    assert decide(s, Params(6.0, 2.0), seen(s)).replicas == 4
    assert mean_wait(4, 2.03, 4.29) == pytest.approx(0.395, abs=1e-3)
    assert mean_wait(3, 2.03, 4.29) == pytest.approx(2.028, abs=1e-3)
    rho = 0.6  # one server: Erlang C is M/M/1
    assert mean_wait(1, rho, 2.0) == pytest.approx(2.0 * rho / (1 - rho))
    assert mean_wait(2, 2.0, 1.0) == math.inf


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
    s = snap(0.0, hi=3, work_rate=1.0, request_rate=1.0, queued=40.0)
    assert decide(s, PARAMS, seen(s)).replicas == 3
    assert decide(snap(0.0, lo=2, hi=3), PARAMS, State()).replicas == 2
    overloaded = snap(0.0, hi=3, work_rate=10.0, request_rate=10.0)
    assert decide(overloaded, PARAMS, State()).replicas == 3


def test_never_scales_down_while_a_backlog_is_above_target() -> None:
    s = snap(2.5, 0.0, 0.0)  # arrivals fit on 1 idle replica, but r0's queue is over 2 s
    d = decide(s, PARAMS, seen(s))
    assert d.replicas == 3 and "held" in d.reason and d.needed == 1
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
    assert clear_time(0.0, 0.0, [(0.0, 0.0)], 2.0) == 0.0
    # 8 s queued on the only replica: it takes arrivals again once 2 s are left
    assert clear_time(0.0, 0.0, [(6.0, 2.0)], 2.0) == pytest.approx(6.0)
    assert clear_time(0.0, 0.0, [(1.0, 0.0), (6.0, 2.0)], 2.0) == pytest.approx(1.0)
    # 8 s waiting at the handles is any replica's: shared as replicas join
    assert clear_time(8.0, 0.0, [(0.0, 0.0)] + [(1.0, 0.0)] * 3, 2.0) == pytest.approx(1.0)
    assert clear_time(8.0, 0.0, [(0.0, 0.0), (1.0, 0.0), (1.0, 0.0)], 2.0
                      ) == pytest.approx(1.0 + 1.0 / 3)
    assert clear_time(1.0, 2.0, [(0.0, 0.0)] * 2, 0.1) == math.inf  # arrivals outpace 2
    assert clear_time(5.0, 1.0, [(2.0, 0.0)], 1.0) == math.inf  # 1 replica, 1 s/s arriving
