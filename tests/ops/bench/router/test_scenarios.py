"""``kvroute bench router --move`` on a real redis-server (a short session), and the
``--agent`` table from a result. Figures are printed by the bench, not asserted here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ops.bench.router.scenarios import MOVE_CASES, agent_markdown, move_markdown, run_move
from tests.stacks import redis_url


def test_move_reads_the_session_from_redis(tiny_model_dir: Path, stack_redis: Any) -> None:
    result = run_move(str(tiny_model_dir), sessions=1, length=24000, turns=4,
                      redis_url=redis_url(stack_redis), show=False)
    table = {r["case"]: r for r in result["move"]["table"]}
    assert list(table) == list(MOVE_CASES)
    tokens = table["cache off"]["tokens"]
    assert 18000 < tokens < 30000
    assert table["cache off"]["tokenized_p50"] == tokens
    assert table["local only"]["tokenized_p50"] == tokens  # a new replica: nothing local
    moved = table["local + Redis"]
    assert moved["from_redis_p50"] > 0.9 * tokens
    assert moved["tokenized_p50"] + moved["from_redis_p50"] == tokens
    assert table["same replica"]["tokenized_p50"] == moved["tokenized_p50"]
    assert "| local + Redis |" in move_markdown(result)


def test_agent_table() -> None:
    modes = [{"mode": m, "requests": 100, "prompt_tokens_mean": 20000.0,
              "cpu_ms_per_request": cpu, "tier_cpu_ms_per_request": tier,
              "worker_cpu_ms_per_request": worker, "ttft_ms_p50": 50.0}
             for m, cpu, tier, worker in (("before", 40.0, 90.0, 6.0), ("after", 8.0, 9.0, 5.5))]
    text = agent_markdown({"agent": {"modes": modes, "after_over_before": 0.2,
                                     "tier_after_over_before": 0.1}})
    assert "| 1 | before | 100 | 20,000 | 0 | 0.00 | 40.0 | 90.0 | 6.0 | 50 |" in text
    assert "| 1 | after | 100 | 20,000 | 0 | 0.00 | 8.0 | 9.0 | 5.5 | 50 |" in text
    assert "after / before, router CPU per request: 0.20x" in text
    assert "after / before, router + proxy CPU per request: 0.10x" in text


def test_capped_agent_workload_keeps_the_sessions() -> None:
    from ops.bench.harness.workloads import AgentParams, AgentWorkload, flatten
    from ops.bench.router.scenarios import _Capped

    params = AgentParams(seed=2, subagent_prob=0.5)
    plain = flatten(AgentWorkload(params, salt="s").session(0))
    capped = flatten(_Capped(params, "s", 1).session(0))
    assert [c.request.key for c in capped] == [c.request.key for c in plain]
    assert all(c.request.body["max_tokens"] == 1 for c in capped)
    assert [c.request.body["messages"] for c in capped] == \
        [c.request.body["messages"] for c in plain]


def test_agent_ratios_are_over_all_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.bench.router import scenarios as rs

    cpu = {"before": (8.0, 4.0), "after": (3.0, 0.1), "paced": (2.0, 0.1)}  # router, proxy s

    def fake_mode(mode: str, spec: rs.AgentBenchSpec, model_path: str) -> dict[str, float]:
        router, proxy = cpu[mode]
        return {"mode": mode, "requests": 100, "router_cpu_s": router, "proxy_cpu_s": proxy}

    monkeypatch.setattr(rs, "agent_mode", fake_mode)
    spec = rs.AgentBenchSpec(rounds=2, modes=("before", "after", "paced"), paced_ms=20)
    got = rs.run_agent(spec, "unused", show=False)["agent"]
    assert got["cpu_ms_per_request"] == {"before": 80.0, "after": 30.0, "paced": 20.0}
    assert got["after_over_before"] == pytest.approx(3 / 8)
    assert got["tier_after_over_before"] == pytest.approx(3.1 / 12)
    assert got["tier_paced_over_before"] == pytest.approx(2.1 / 12)


def test_the_stack_keeps_the_models_stream_pacing_unless_a_mode_sets_it() -> None:
    """"after" must measure kvroute's defaults: the stack sets ``stream_interval_ms`` only
    when asked ("paced"), so a bench of the shipped config is one."""
    from deploy.config.model import ModelConfig
    from ops.bench.compare.bench import CompareSpec, build_config

    shipped = ModelConfig.model_fields["stream_interval_ms"].default
    assert build_config(CompareSpec(), "/m", 0).models[0].stream_interval_ms == shipped
    assert shipped == 0.0  # a chunk per token, as vLLM and SGLang stream
    paced = build_config(CompareSpec(stream_interval_ms=20.0), "/m", 0).models[0]
    assert paced.stream_interval_ms == 20.0
