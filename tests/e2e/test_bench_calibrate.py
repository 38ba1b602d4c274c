"""``kvroute bench calibrate`` end to end on a tiny budget: the real engine's curves behind
kvroute, the emulator fitted to them, both replaying the same short agent sessions and
trace requests. No accuracy assertions (a few requests prove nothing): every request is
served by both, the JSON has the shape docs/routing.md gives, and the profile it writes
is one the emulator loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ops.bench.calibrate.command import calibrate, profile
from ops.bench.calibrate.measure import CurveSpec
from ops.bench.calibrate.replay import SMALL_AGENT, ReplaySpec
from ops.bench.harness.report import json_text
from workers.engines.sim.profile import FITTED, load_profile

pytestmark = [pytest.mark.slow, pytest.mark.load]

TRACE = [(0, 1024, 20, [1, 2]), (100, 1100, 3, [1, 2, 3]), (200, 600, 5, [7, 8])]


def short_calibration(engine: str, model: Path, port: int, tmp: Path) -> dict[str, Any]:
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n,
                                         "output_length": o, "hash_ids": h}) + "\n"
                             for t, n, o, h in TRACE))
    curves = CurveSpec(lengths=(8, 32), cached=(128,), suffix=8, batches=(1, 2),
                       decode_tokens=4, samples=1)
    replay = ReplaySpec(trace=str(trace), trace_requests=3, block_tokens=8, max_output=2,
                        agent_sessions=1, agent=SMALL_AGENT, concurrency=2)
    return calibrate(engine, str(model), curves, replay, port=port)


def check_result(result: dict[str, Any], engine: str, tmp: Path) -> None:
    assert result["engine"] == engine
    assert set(result["fitted"]) == set(FITTED)
    assert result["fitted"]["prefill_tok_s"] > 0 and result["fitted"]["tpot_s"] >= 0
    e = result["error"]
    assert set(e) >= {"ttft_rel_median", "ttft_rel_p90", "hit_rate_diff"}
    assert e["real_errors"] == 0 and e["sim_errors"] == 0
    assert set(e["by_workload"]) == {"agent", "trace"}
    assert all(w["requests"] > 0 for w in e["by_workload"].values())
    assert e["requests"] == sum(w["requests"] for w in e["by_workload"].values())
    for side in ("real", "sim"):
        assert [p["x"] for p in result["curves"][side]["prefill_cold"]] == [8, 32]
    # the prefix primed before the hit was served from the cache on the real engine
    assert result["curves"]["real"]["prefill_cached"][1]["cached_tokens"] > 0
    path = tmp / "profile.json"
    path.write_text(json_text(profile(result)))
    assert load_profile(str(path)) == pytest.approx(result["fitted"])


def test_short_calibration_on_mlx(ray_local: None, serve_port: int, tiny_model_dir: Path,
                                  tmp_path: Path) -> None:
    result = short_calibration("mlx", tiny_model_dir, serve_port, tmp_path)
    check_result(result, "mlx", tmp_path)


@pytest.mark.vllm
def test_short_calibration_on_vllm(ray_local: None, serve_port: int, tiny_model_dir: Path,
                                   tmp_path: Path) -> None:
    result = short_calibration("vllm", tiny_model_dir, serve_port, tmp_path)
    check_result(result, "vllm", tmp_path)
