"""``kvroute bench autoscale``'s pieces without a cluster: the trace arrivals, the agent
calls, the SLO share, the replica-seconds and the scale-down cost bookkeeping (the run
itself is a benchmark, not a test)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ops.bench.autoscale.bench import (
    AutoscaleSpec,
    agent_calls,
    arrivals,
    build_config,
    label,
    slo_attainment,
)
from ops.bench.autoscale.watch import ScaleDown, Watch, least_lost
from ops.bench.harness.client import Record
from ops.bench.harness.workloads import AgentParams, AgentWorkload

CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:17:{s:02d}.5000000,100,10\n" for s in (0, 1, 2, 10, 11, 12, 13, 40))


def test_arrivals_shift_speed_up_and_thin(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(CSV)
    spec = AutoscaleSpec(trace=str(trace), duration_s=10.0, speedup=2.0, sample=1.0,
                         trace_start_s=1.0)
    # trace seconds 1..20 (0 is before the start, 40 after the end), halved
    assert arrivals(spec) == [0.0, 0.5, 4.5, 5.0, 5.5, 6.0]
    thinned = [arrivals(AutoscaleSpec(trace=str(trace), duration_s=30.0, sample=0.5, seed=s,
                                      trace_start_s=0.0))
               for s in range(20)]
    assert all(set(t) <= {0.0, 0.5, 1.0, 5.0, 5.5, 6.0, 6.5, 20.0} for t in thinned)
    assert 0 < sum(map(len, thinned)) < 20 * 8  # some kept, some not


def test_agent_calls_interleave_sessions_and_replace_finished_ones() -> None:
    workload = AgentWorkload(AgentParams(tasks_mean=1.0, turns_mean=2.0))
    keys = [r.key for r in itertools.islice(agent_calls(workload, 3), 40)]
    assert keys[:3] == ["s0.t0", "s1.t0", "s2.t0"]
    assert len(set(keys)) == 40  # each call once
    assert any(k.startswith("s3.") for k in keys)  # finished sessions were replaced


def test_slo_attainment_counts_failures_as_misses() -> None:
    recs = [Record("a", "", 0.0, ttft_s=0.5), Record("b", "", 0.0, ttft_s=3.0),
            Record("c", "", 0.0, error="HTTP 503"), Record("d", "", 0.0, ttft_s=2.0)]
    assert slo_attainment(recs, 2.0) == pytest.approx(0.5)
    assert slo_attainment([], 2.0) == 0.0


def test_replica_seconds_integrate_the_samples() -> None:
    w = Watch("http://x", "m", "app", index=None)  # type: ignore[arg-type]
    w.replicas = [(0.0, 1, 1), (10.0, 1, 3), (20.0, 3, 3), (30.0, 1, 1)]
    assert w.replica_seconds(25.0) == pytest.approx(10 * 1 + 10 * 3 + 5 * 3)
    assert w.replica_seconds(40.0) == pytest.approx(10 + 30 + 30 + 10)
    w.cpu_busy = [0.2, 0.4, 0.9, 0.3]
    assert (w.summary()["cpu_busy_mean"], w.summary()["cpu_busy_p90"]) == pytest.approx(
        (0.45, 0.75))


def test_scale_down_cost_counts_blocks_only_the_stopped_replicas_held() -> None:
    w = Watch("http://x", "m", "app", index=None)  # type: ignore[arg-type]
    w._holdings = {"a": {1, 2, 3, 4}, "b": {1, 2, 9}, "c": {1, 2, 3}, "d": {5, 6, 7}}
    w._record({"b"})
    # b alone held 9; c holds nothing alone: Serve's pick lost 1 block, c would lose 0
    assert w.scale_downs[-1] == ScaleDown(w.scale_downs[-1].t, ("b",), 3, 1, 0, 8)
    w._record({"a", "d"})
    # a and d alone held 4, 5, 6, 7 (3 is also c's); the cheapest pair is b and c: 9
    down = w.scale_downs[-1]
    assert (down.replicas, down.held_blocks, down.lost_blocks, down.least_lost_blocks) == (
        ("a", "d"), 7, 4, 1)
    summary = w.summary()
    assert summary["scale_down_lost_blocks"] == 5
    assert summary["scale_down_least_lost_blocks"] == 1
    held = {f"r{i}": {i} for i in range(20)}  # too many pairs to try: the greedy choice
    assert least_lost(held, 10, max_sets=10) == 10


def test_config_selects_the_policy_under_test() -> None:
    for policy in ("kvroute", "serve-default"):
        cfg = build_config(AutoscaleSpec(policy=policy), "/m", "redis://127.0.0.1:1/0", 8123)
        assert label(AutoscaleSpec(policy=policy, target_ongoing_requests=4.0)) in (
            "kvroute", "serve-default@4")
        (model,) = cfg.models
        assert model.autoscaling.policy == policy and model.num_replicas is None
        assert cfg.index.redis_url and cfg.server.port == 8123


def test_prewarm_off_is_configured_and_labelled() -> None:
    spec = AutoscaleSpec(policy="serve-default", target_ongoing_requests=2.0, prewarm=False)
    cfg = build_config(spec, "/m", "redis://127.0.0.1:1/0", 8123)
    assert not cfg.router.prewarm.enabled and label(spec) == "serve-default@2-noprewarm"
    assert build_config(AutoscaleSpec(), "/m", "redis://127.0.0.1:1/0", 8123
                        ).router.prewarm.enabled


def test_kvroute_objective_sweep_is_configured_and_labelled() -> None:
    spec = AutoscaleSpec(policy="kvroute", ttft_target_s=6.0, policy_ttft_s=10.0)
    cfg = build_config(spec, "/m", "redis://127.0.0.1:1/0", 8123)
    assert cfg.models[0].autoscaling.ttft_target_s == 10.0 and label(spec) == "kvroute@10s"
    same = AutoscaleSpec(policy="kvroute", ttft_target_s=6.0)
    assert build_config(same, "/m", "redis://127.0.0.1:1/0", 8123
                        ).models[0].autoscaling.ttft_target_s == 6.0
    assert label(same) == "kvroute"


def test_cli_runs_one_spec_per_policy_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from ops.bench.autoscale import bench as autoscale
    from ops.bench.autoscale import command as autoscale_cli

    seen: list[AutoscaleSpec] = []

    def fake_run(specs: list[AutoscaleSpec], **_: object) -> list[dict[str, object]]:
        seen.extend(specs)
        raise SystemExit(0)

    monkeypatch.setattr(autoscale, "run_autoscale", fake_run)
    parser = argparse.ArgumentParser()
    autoscale_cli.add_arguments(parser)
    args = parser.parse_args(["--policy", "kvroute,serve-default", "--ttft-target", "6",
                              "--policy-ttft", "6,9", "--target-ongoing", "0.5,1"])
    with pytest.raises(SystemExit):
        autoscale_cli.run(args)
    assert [label(s) for s in seen] == ["kvroute", "kvroute@9s", "serve-default@0.5",
                                        "serve-default@1"]
    assert all(s.ttft_target_s == 6.0 for s in seen)
