"""The calibration's fits (``ops.bench.calibrate.fit``) and its error
(``ops.bench.calibrate.replay.error``), on made-up curves and records."""

from __future__ import annotations

import pytest

from ops.bench.calibrate.fit import fit, line
from ops.bench.calibrate.measure import Point, ids
from ops.bench.calibrate.replay import ReplaySpec, error, trace_slice
from ops.bench.harness.client import Record


def test_fit_recovers_the_emulators_constants() -> None:
    p, base, stack, load, tpot, per = 500.0, 0.03, 0.01, 4000.0, 0.02, 0.002
    curves = {
        "prefill_cold": [Point(n, stack + base + n / p) for n in (16, 64, 128, 256)],
        "prefill_cached": [Point(c, stack + base + 32 / p + c / load, cached_tokens=c)
                           for c in (0, 128, 256)],
        "decode": [Point(b, tpot + per * (b - 1)) for b in (1, 2, 4, 8)],
    }
    fitted, lines = fit(curves, stack)
    assert fitted["prefill_tok_s"] == pytest.approx(p)
    assert fitted["prefill_base_s"] == pytest.approx(base)
    assert fitted["cache_load_tok_s"] == pytest.approx(load)
    assert (fitted["tpot_s"], fitted["tpot_per_batch_s"]) == (pytest.approx(tpot),
                                                              pytest.approx(per))
    assert lines["prefill_cold"].rel_rmse == pytest.approx(0.0, abs=1e-9)


def test_a_free_cached_prefix_and_a_slow_stack_clamp_to_zero() -> None:
    curves = {"prefill_cold": [Point(16, 0.1), Point(64, 0.2)],
              "prefill_cached": [Point(128, 0.3, 128), Point(256, 0.3, 256)],
              "decode": [Point(1, 0.05)]}
    fitted, _ = fit(curves, stack_s=1.0)
    assert fitted["prefill_base_s"] == 0.0 and fitted["cache_load_tok_s"] == 0.0
    assert fitted["tpot_per_batch_s"] == 0.0  # one batch size: no slope
    assert line([(1.0, 2.0)]).slope == 0.0


def rec(key: str, ttft: float, cached: int = 0, prompt: int = 100) -> Record:
    return Record(key, "", 0.0, ttft_s=ttft, prompt_tokens=prompt, cached_tokens=cached)


def test_error_matches_requests_by_key() -> None:
    real = [rec("a", 1.0, 50), rec("b", 2.0, 0), rec("only-real", 1.0)]
    sim = [rec("b", 3.0, 0), rec("a", 1.2, 60), rec("only-sim", 9.0)]
    e = error(real, sim)
    assert e["requests"] == 2
    assert e["ttft_rel_median"] == pytest.approx(0.35)  # 0.2 and 0.5
    assert e["hit_rate_diff"] == pytest.approx(0.05)  # (60 - 50) / 200


def test_the_trace_slice_keeps_its_prefix_sharing(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 50, '
                     '"hash_ids": [1, 2]}\n{"timestamp": 5, "input_length": 1100, '
                     '"output_length": 3, "hash_ids": [1, 2, 3]}\n')
    a, b = trace_slice(ReplaySpec(trace=str(trace), block_tokens=16, max_output=8), "s")
    pa, pb = a.body["prompt"], b.body["prompt"]
    assert len(pa) == 32 and len(pb) == 34 and pb[:32] == pa
    assert (a.body["max_tokens"], b.body["max_tokens"]) == (8, 3)
    assert ids("k", 600)[:512] == ids("k", 512) and ids("k", 8) != ids("j", 8)
