"""``kvroute bench overhead`` end to end, for a few seconds of load: the engine's own server
(``mlx_lm.server``; ``vllm serve`` in the vLLM venv) and kvroute in front of the same engine,
alternated. No performance assertions: both targets serve every request, the JSON has the
shape docs/benchmarks.md gives, and the bare servers are gone at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from ops.bench.harness import report
from ops.bench.overhead import bench
from ops.bench.overhead.command import markdown
from ops.bench.overhead.targets import EngineSettings
from ops.bench.overhead.workload import Workload

pytestmark = [pytest.mark.slow, pytest.mark.load]


def short_run(engine: str, model: Path, port: int, started: list[int],
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    real = bench.targets.bare_server

    def recording(*args: Any) -> Any:
        proc, name = real(*args)
        real_start = proc.start

        def start() -> None:
            real_start()
            assert proc.proc is not None
            started.append(proc.proc.pid)

        proc.start = start  # type: ignore[method-assign]
        return proc, name

    monkeypatch.setattr(bench.targets, "bare_server", recording)
    spec = bench.OverheadSpec(
        settings=EngineSettings(engine, str(model)), replicas=1,
        workload=Workload(prompt_tokens=48, prefix_tokens=32, max_tokens=4),
        concurrencies=(2,), rounds=1, cell_s=3.0, pause_s=0.1, drain_timeout_s=120.0)
    return bench.run_overhead(spec, show=False, port=port)


def check_result(result: dict[str, Any], engine: str, started: list[int]) -> None:
    assert result["engine"] == engine and result["replicas"] == 1
    runs = result["runs"]
    # shared and cold, one round each: bare, kvroute, bare, kvroute
    assert [r["target"] for r in runs] == ["bare", "kvroute"] * 2
    assert [r["mode"] for r in runs] == ["shared"] * 2 + ["cold"] * 2
    for run in runs:
        report.validate(run)
        assert run["requests"] > 0 and run["errors"] == 0, run["params"]["error_samples"]
        assert run["throughput_tok_s"] > 0
        assert set(run["ttft_s"]) >= {"p50", "p99"} and set(run["itl_s"]) >= {"p50", "p99"}
        assert 0 <= run["cached_token_ratio"] <= 1
    for cell in result["cells"]:
        # same requests: the same prompt lengths through either target's template
        assert cell["bare"]["prompt_tokens_mean"] == pytest.approx(
            cell["kvroute"]["prompt_tokens_mean"], rel=0.05)
    assert set(result["ratios"]) >= {"throughput", "ttft_p50_delta_s"}
    assert result["ratios"]["throughput"] > 0
    assert result["goals"]["zero_errors"]
    assert result["params"]["stream_interval_ms"] == 0.0
    assert "| shared | 2 |" in markdown(result)
    assert started and not [pid for pid in started if psutil.pid_exists(pid)]


def test_short_overhead_on_mlx(ray_local: None, serve_port: int, tiny_model_dir: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    result = short_run("mlx", tiny_model_dir, serve_port, started, monkeypatch)
    check_result(result, "mlx", started)


@pytest.mark.vllm
def test_short_overhead_on_vllm(ray_local: None, serve_port: int, tiny_model_dir: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    result = short_run("vllm", tiny_model_dir, serve_port, started, monkeypatch)
    check_result(result, "vllm", started)
