"""Calibrated costs of the sim emulator (``prefill_base_s``, ``cache_load_tok_s``, in
virtual time) and its profiles (``engine_kwargs.profile``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.config import ModelConfig
from tests.workers.engines.sim.test_sim_engine import drain, first_token_times
from workers.engines import make_engine
from workers.engines.sim.core import SimCore, SimParams, SimRequest
from workers.engines.sim.profile import PROFILES, load_profile


def ttft_of_second(p: SimParams) -> float:
    """TTFT of a prompt whose first 2 of 3 blocks a previous request left cached."""
    core = SimCore(p, "m", "r")
    core.submit(SimRequest("a", [1, 2, 9], 30, 1), 0.0)
    drain(core)
    core.submit(SimRequest("b", [1, 2, 3], 30, 1), 10.0)
    return first_token_times(drain(core))["b"] - 10.0


def test_defaults_keep_a_cached_prefix_free_and_no_fixed_cost() -> None:
    # 20 of 30 tokens cached: 10 computed at 1000 tok/s
    assert ttft_of_second(SimParams(block_size=10, prefill_tok_s=1000.0)) == \
        pytest.approx(0.010, abs=1e-3)


def test_prefill_base_and_cache_load_add_their_time() -> None:
    p = SimParams(block_size=10, prefill_tok_s=1000.0, prefill_base_s=0.05,
                  cache_load_tok_s=2000.0)
    # 10 computed (0.010) + 20 cached taken up at 2000 tok/s (0.010) + the base (0.050)
    assert ttft_of_second(p) == pytest.approx(0.070, abs=2e-3)


def test_negative_costs_are_refused() -> None:
    with pytest.raises(ValueError, match="prefill_base_s"):
        SimParams(prefill_base_s=-1.0)


def test_a_profile_file_gives_defaults_and_kwargs_override(tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"engine": "mlx", "fitted": {
        "prefill_tok_s": 1234.0, "tpot_s": 0.03, "tpot_per_batch_s": 0.001,
        "prefill_base_s": 0.02, "cache_load_tok_s": 5000.0}}))
    assert load_profile(str(path))["prefill_tok_s"] == 1234.0
    cfg = ModelConfig(name="m", engine="sim", model_path=str(tiny_model_dir),
                      engine_kwargs={"profile": str(path), "tpot_s": 0.05})
    params = make_engine(cfg, "r0", 64).params  # type: ignore[attr-defined]
    assert (params.prefill_tok_s, params.tpot_s, params.cache_load_tok_s) == \
        (1234.0, 0.05, 5000.0)


def test_unknown_or_broken_profiles_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_profile("no-such-profile")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="unreadable"):
        load_profile(str(bad))


def test_every_shipped_profile_loads() -> None:
    for path in PROFILES.glob("*.json"):
        fitted = load_profile(path.stem)
        assert fitted["prefill_tok_s"] > 0 and fitted["tpot_s"] > 0, path
