"""Peer router launch commands (ops/bench/compare/peers.py) and router CPU metering
(ops/bench/harness/lineup.py, procs.py). The peers' real runs: test_bench_compare.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ops.bench.compare import peers
from ops.bench.harness import lineup

W = ["http://127.0.0.1:1001", "http://127.0.0.1:1002"]
E: list[str | None] = ["tcp://127.0.0.1:2001", "tcp://127.0.0.1:2002"]


@pytest.fixture(autouse=True)
def no_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(peers, "ensure_venv", lambda package: tmp_path / package / "bin")


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_vllm_router_kv_aware_subscribes_to_every_replica() -> None:
    run = peers.vllm_router("vllm-router", W, E, "/models/tiny", "kv_aware", 16)
    sources = [run.cmd[i + 1] for i, a in enumerate(run.cmd) if a == "--kv-event-source"]
    assert sources == [f"{w}={e}" for w, e in zip(W, E, strict=True)]
    assert flag(run.cmd, "--kv-event-block-size") == "16"
    assert flag(run.cmd, "--kv-event-model") == "/models/tiny"
    assert run.flags["--policy"] == "kv_aware" and run.flags["--router-temperature"] == 0.0
    for f in ("--host", "--prometheus-host"):  # both default to 0.0.0.0
        assert flag(run.cmd, f) == "127.0.0.1"
    assert run.process().ready_url == f"http://127.0.0.1:{run.port}/v1/models"


def test_kv_aware_without_events_is_refused() -> None:
    with pytest.raises(RuntimeError, match="KV events"):
        peers.vllm_router("vllm-router", W, [E[0], None], "/m", "kv_aware", 16)


def test_cache_aware_flags_are_explicit_and_in_the_command() -> None:
    for run in (peers.smg("smg", W, "/m", "cache_aware"),
                peers.vllm_router("v", W, [None, None], "/m", "cache_aware", 16)):
        assert run.flags["--cache-threshold"] == 0.3
        for k, v in run.flags.items():
            assert flag(run.cmd, k) == str(v)
    smg = peers.smg("smg", W, "/m", "cache_aware")
    assert smg.flags["--worker-warmup-secs"] == 0 and flag(smg.cmd, "--host") == "127.0.0.1"


def test_cpu_meter_counts_a_child_process_tree() -> None:
    """A child that burns CPU only between start() and stop() is counted, per process."""
    code = ("import sys\nsys.stdin.readline()\nsum(range(5_000_000))\n"
            "print('done', flush=True)\nsys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        meter = lineup.CpuMeter([psutil.Process(child.pid)])
        meter.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        meter.stop()
    finally:
        child.kill()
        child.wait(10)
    assert meter.seconds > 0.05
    assert list(meter.per_process) == [f"{child.pid} {Path(sys.executable).name}"]
    assert meter.summary(10)["cpu_s_per_request"] == pytest.approx(meter.seconds / 10)
