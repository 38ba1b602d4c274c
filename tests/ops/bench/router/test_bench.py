"""``kvroute bench router``'s pieces that need no cluster: prompts of the asked length, the
table and the bench JSON (ARCHITECTURE.md's schema) from samples."""

from __future__ import annotations

from pathlib import Path

from ops.bench.harness import report
from ops.bench.router.bench import (
    TURN_TOKENS,
    Prompts,
    RouterBenchSpec,
    Sample,
    bench_stack,
    markdown,
    mode_bench,
    rows,
)


def test_prompts_reach_the_length_and_grow_by_a_turn(tiny_model_dir: Path) -> None:
    p = Prompts(str(tiny_model_dir))
    turns = p.turns("s", 8000, 4)
    sizes = [len(p.ids(chat)) for chat in turns]
    assert 0.8 * 8000 < sizes[-1] < 1.2 * 8000
    growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert all(0.7 * TURN_TOKENS < g < 1.5 * TURN_TOKENS for g in growth), growth
    assert p.one("a", 2000) != p.one("b", 2000)  # a salt makes a cold prompt


def _samples() -> list[Sample]:
    out = []
    for mode, cpu in (("before", 0.3), ("after", 0.01)):
        for scenario in ("repeat", "grow", "cold"):
            for i in range(3):
                out.append(Sample(mode, scenario, 1000, 1000 + i, cpu, cpu + 0.01, 0.005))
    return out


def test_rows_and_json() -> None:
    samples = _samples()
    table = rows(samples)
    assert [(r["scenario"], r["mode"]) for r in table[:2]] == [("repeat", "before"),
                                                               ("repeat", "after")]
    repeat_before = table[0]
    assert repeat_before["n"] == 2  # the first, cold request of a repeated prompt is left out
    assert abs(repeat_before["cpu_ms_mean"] - 300) < 1e-6
    assert abs(repeat_before["added_ms_p50"] - 305) < 1e-6
    bench = mode_bench("after", samples, RouterBenchSpec())
    report.validate(bench)
    assert bench["requests"] == 9 and bench["errors"] == 0
    text = markdown({"table": table, "stall": {"after": {
        "unloaded_p99_s": 0.02, "cold_long_prompt_p99_s": 0.03, "cold_long_prompt_max_s": 0.05}}})
    assert "| repeat | 1,002 | before | 2 | 300.0 |" in text


def test_the_bench_stack_runs_no_peers_event_encoder() -> None:
    from ops.bench.compare.bench import CompareSpec, build_config

    spec = RouterBenchSpec(lengths=(1000, 160000))
    model = build_config(bench_stack(spec, "proxy"), "/m", 0).models[0]
    assert model.vllm_kv_events is None and model.context_window == 320000
    assert build_config(CompareSpec(), "/m", 0).models[0].vllm_kv_events is not None
