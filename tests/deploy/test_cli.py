"""`kvroute up` as a user runs it: the offline demo comes up, serves, and Ctrl-C
leaves no Ray process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.slow


def _wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "kvroute up exited early"
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200 and r.json()["replicas"] == {"tiny-llama": 2}:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("kvroute up never became healthy")


def test_make_model_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "make-model", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=120, check=True)
    assert Path(out.stdout.strip()) == tmp_path / "m"
    assert (tmp_path / "m" / "model.safetensors").exists()


def test_up_serves_demo_and_ctrl_c_cleans_up(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["KVROUTE_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "up", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc, timeout_s=240)
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4})
        assert r.status_code == 200 and r.headers["x-kvroute-replica"]
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in tree)
    finally:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0].decode(errors="replace")
    assert proc.returncode == 0, output[-2000:]
    assert "serving at" in output, output
    time.sleep(2)
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline()[:2] for p in alive]
