"""``kvroute up --model PATH_OR_ID``: one real checkpoint served with no YAML, as
``vllm serve`` and ``mlx_lm.server`` do; and the checks ``kvroute up`` makes before it
starts anything (a port held by another program, a hub id that cannot be had offline)."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import platform
import re
import socket
from pathlib import Path

from deploy.config import EngineName, KvrouteConfig, ModelConfig


def add_model_args(up: argparse.ArgumentParser) -> None:
    up.add_argument("--model", help="serve this checkpoint (a local folder or a hub id) "
                    "instead of a config file or the demo")
    up.add_argument("--name", help="the model name clients send (default: from --model)")
    up.add_argument("--engine", choices=["mlx", "vllm"],
                    help="with --model: the engine (default: mlx on Apple silicon or where "
                    "mlx-lm is installed without vLLM, else vllm)")
    up.add_argument("--context-window", type=int, help="with --model: prompt + output tokens")


def model_config(args: argparse.Namespace) -> KvrouteConfig:
    """The config for ``--model``: one model, its replicas, the embedded index."""
    engine = args.engine or default_engine()
    fields: dict[str, object] = {
        "name": args.name or model_name(args.model), "engine": engine,
        "model_path": checkpoint(args.model), "num_replicas": args.replicas or 1,
    }
    if args.context_window:
        fields["context_window"] = args.context_window
    return KvrouteConfig(models=[ModelConfig.model_validate(fields)])


def default_engine() -> EngineName:
    has_mlx = importlib.util.find_spec("mlx_lm") is not None
    has_vllm = importlib.util.find_spec("vllm") is not None
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    return "mlx" if has_mlx and (apple or not has_vllm) else "vllm"


def model_name(model: str) -> str:
    """``org/Some-Model-7B`` → ``some-model-7b``: what a model name may hold."""
    base = Path(model.rstrip("/")).name or model
    return re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-") or "model"


def checkpoint(model: str) -> str:
    """A local folder as is; a hub id as is when it is cached here or the hub may be reached
    (the engines load it their own way); a clear error when it cannot be had offline."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if path.exists() or model.startswith((".", "/", "~")):
        raise SystemExit(f"kvroute up: --model {model}: no such folder")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(model, local_files_only=True)
        return model  # cached: the engines find it there
    except (LocalEntryNotFoundError, ValueError, OSError):
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            raise SystemExit(
                f"kvroute up: --model {model} is not a local folder and not in the Hugging "
                "Face cache, and HF_HUB_OFFLINE is set: download it where the hub is "
                f"reachable (huggingface-cli download {model}) or pass a local folder"
            ) from None
        return model


def refuse_busy_port(host: str, port: int) -> None:
    """Refuse a port another program listens on. The router replicas listen with
    SO_REUSEPORT, so without this a second ``kvroute up`` would share the port with the
    first and the kernel would split the clients between them."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no user
        try:
            sock.bind((host, port))  # no SO_REUSEPORT: fails while anyone listens there
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise SystemExit(
                f"kvroute up: {host}:{port} is already in use by another program (an older "
                "kvroute up?): stop it, or pick another port with --port") from None
