"""``kvroute bench overhead``'s workload and summaries, without a server."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ops.bench.harness.client import Record
from ops.bench.overhead.bench import cell_summary, overall_ratios
from ops.bench.overhead.targets import EngineSettings
from ops.bench.overhead.workload import PromptText, Workload, requests


def contents(mode: str, salt: str, text: PromptText, n: int = 3) -> list[str]:
    return [r.body["messages"][0]["content"]
            for r in itertools.islice(requests(mode, salt, Workload(), text), n)]


def test_shared_prompts_share_the_prefix_and_cold_ones_do_not(tiny_model_dir: Path) -> None:
    text = PromptText(tiny_model_dir)
    shared = contents("shared", "r0", text)
    prefix = shared[0].split(" [r0 #0]")[0]
    assert all(s.startswith(prefix) for s in shared) and len(set(shared)) == 3
    cold = contents("cold", "r0", text)
    assert len({c[:2] for c in cold}) == 3  # they differ from the first character
    assert contents("shared", "r0", text) == shared  # deterministic
    assert contents("shared", "r1", text)[0][:20] != shared[0][:20]  # a new salt: cold
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert abs(len(tok.encode(shared[0]).ids) - 128) <= 16


def test_bad_workloads_are_refused() -> None:
    with pytest.raises(ValueError):
        Workload(prompt_tokens=10, prefix_tokens=10)
    with pytest.raises(ValueError):
        EngineSettings("sim", "/m")


def test_bare_servers_get_kvroutes_settings() -> None:
    s = EngineSettings("mlx", "/m")
    cmd, model = s.bare_command(1234)
    assert model == "default_model" and cmd[cmd.index("--decode-concurrency") + 1] == "32"
    assert cmd[cmd.index("--prompt-cache-bytes") + 1] == str(s.engine_kwargs()["cache_bytes"])
    v = EngineSettings("vllm", "/m")
    vcmd, _ = v.bare_command(1234)
    assert "vllm.entrypoints.openai.api_server" in vcmd
    assert vcmd[vcmd.index("--max-model-len") + 1] == "8192"


def run(ttfts: list[float], tokens: int, window: float) -> tuple[dict, list[Record]]:
    recs = [Record(f"k{i}", "", 0.0, ttft_s=t, e2e_s=window, tpot_s=0.01, prompt_tokens=100,
                   cached_tokens=50, completion_tokens=tokens) for i, t in enumerate(ttfts)]
    return {"requests": len(recs), "errors": 0,
            "throughput_tok_s": tokens * len(recs) / window}, recs


def test_cells_and_overall_ratios() -> None:
    bare = [run([0.100, 0.100], 10, 2.0)]
    kv = [run([0.104, 0.104], 10, 2.1)]
    cell = cell_summary("shared", 2, {"bare": bare, "kvroute": kv})
    assert cell["ratios"]["throughput"] == pytest.approx(2.0 / 2.1)
    assert cell["ratios"]["ttft_p50_delta_s"] == pytest.approx(0.004)
    other = dict(cell, ratios={**cell["ratios"], "throughput": 1.0, "ttft_p50_delta_s": 0.0})
    both = overall_ratios([cell, other])
    assert both["throughput"] == pytest.approx((2.0 / 2.1) ** 0.5)
    assert both["ttft_p50_delta_s"] == pytest.approx(0.002)
