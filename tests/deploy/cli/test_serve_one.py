"""``kvroute up --model`` and the checks ``kvroute up`` makes before it starts anything."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cli.main import build_parser
from deploy.cli.serve_one import checkpoint, model_config, model_name, refuse_busy_port
from deploy.serve.runtime import unclaimed_port

ROOT = Path(__file__).resolve().parents[3]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["up", *argv])


def test_a_local_checkpoint_becomes_a_one_model_config(tiny_model_dir: Path) -> None:
    cfg = model_config(_args("--model", str(tiny_model_dir), "--engine", "mlx",
                             "--context-window", "4096", "--replicas", "2"))
    (m,) = cfg.models
    assert (m.engine, m.model_path, m.context_window, m.num_replicas) == (
        "mlx", str(tiny_model_dir.resolve()), 4096, 2)
    assert m.name == model_name(str(tiny_model_dir)) and cfg.index.redis_url is None
    named = model_config(_args("--model", str(tiny_model_dir), "--name", "coder"))
    assert named.models[0].name == "coder"


def test_a_model_name_is_made_from_the_checkpoint() -> None:
    assert model_name("mlx-community/Qwen2.5-Coder-7B-Instruct-4bit") == (
        "qwen2.5-coder-7b-instruct-4bit")
    assert model_name("/models/My Model/") == "my-model"


def test_a_hub_id_that_cannot_be_had_offline_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="huggingface-cli download some-org/some-model"):
        checkpoint("some-org/some-model")
    with pytest.raises(SystemExit, match="no such folder"):
        checkpoint("./not-here")


def test_a_port_another_program_listens_on_is_refused(tiny_model_dir: Path) -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a router replica does
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(SystemExit, match="already in use"):
            refuse_busy_port("127.0.0.1", port)
        # the real command refuses it before it starts Ray
        done = subprocess.run([sys.executable, "-m", "deploy.cli", "up", "--model",
                               str(tiny_model_dir), "--engine", "mlx", "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "already in use" in done.stderr
        assert "starting Ray" not in done.stdout + done.stderr
    finally:
        holder.close()
    refuse_busy_port("127.0.0.1", port)  # free again


def test_serves_proxy_port_is_outside_the_ranges_others_are_given_ports_from() -> None:
    port = unclaimed_port()
    assert 20000 <= port < 32768
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # and free
