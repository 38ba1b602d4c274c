"""What ``kvroute up`` shows a person: start-up progress, then one line per model.

Ray and Serve write a lot while a stack starts (raylet, controller, replica logs, access
lines). Unless ``--verbose``, ``kvroute up`` sends all of it to a log file named on screen
(``divert_output``: the process's own stdout/stderr file descriptors are pointed at the file,
so worker logs Ray forwards to the driver land there too) and keeps the terminal for
``UpConsole``: one spinner per start-up step, a tick with its duration when it is done, and
while the replicas come up, how many of each model's are ready. The text is built by pure
functions (``waiting_text``, ``summary_lines``) that the tests check without Ray.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from deploy.config import KvrouteConfig, ModelConfig

RUNNING = "RUNNING"  # Serve's ReplicaState for a replica that serves


@dataclass(frozen=True)
class ModelState:
    """One model deployment as the console shows it."""

    name: str
    engine: str
    ready: int  # replicas in Serve's RUNNING state
    wanted: int  # num_replicas, or autoscaling.min_replicas


def wanted_replicas(m: ModelConfig) -> int:
    if m.autoscaling is not None:
        return m.autoscaling.min_replicas
    return m.num_replicas or 1


def model_states(cfg: KvrouteConfig,
                 replica_states: Mapping[str, Mapping[str, int]]) -> list[ModelState]:
    """``replica_states``: deployment name → Serve's {ReplicaState: count} (missing = 0)."""
    return [ModelState(m.name, m.engine, int(replica_states.get(m.name, {}).get(RUNNING, 0)),
                       wanted_replicas(m)) for m in cfg.models]


def waiting_text(states: list[ModelState]) -> str:
    """The spinner's text while replicas start: ``tiny-llama 1/2, coder 0/4``."""
    return "starting replicas: " + ", ".join(f"{s.name} {s.ready}/{s.wanted}" for s in states)


def summary_lines(url: str, states: list[ModelState], elapsed_s: float,
                  log_path: Path | None) -> list[str]:
    """What stays on screen once the stack is healthy."""
    width = max((len(s.name) for s in states), default=0)
    lines = [f"kvroute is serving at {url}  (healthy after {elapsed_s:.1f} s)"]
    lines += [f"  {s.name:<{width}}  {s.engine:<4}  {s.ready}/{s.wanted} replicas ready  "
              f"{url}/v1  (model \"{s.name}\")" for s in states]
    if log_path is not None:
        lines.append(f"  Ray and Serve logs: {log_path}  (--verbose streams them here)")
    lines.append(f"  try: curl {url}/v1/models   — Ctrl-C to stop")
    return lines


def default_log_path(cache_dir: Path) -> Path:
    return cache_dir / "logs" / f"up-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"


def divert_output(log_path: Path) -> IO[str]:
    """Point fds 1 and 2 at ``log_path``; returns a text stream on the old stdout."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    screen = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return screen


class UpConsole:
    """Start-up steps on a terminal (spinners) or a pipe (plain lines)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.console = Console(file=stream or sys.stdout, highlight=False)

    def say(self, line: str) -> None:
        self.console.print(line, markup=False, soft_wrap=True)

    @contextmanager
    def step(self, text: str) -> Iterator[Callable[[str], None]]:
        """A spinner while the block runs, then ``✓ text (N s)``; yields an updater."""
        started = time.monotonic()
        with self.console.status(text) as status:
            yield lambda new: status.update(new)
        self.console.print(f"[green]✓[/] {text} ({time.monotonic() - started:.1f} s)",
                           highlight=False)


def serve_replica_states(app_name: str) -> dict[str, dict[str, int]]:
    """Deployment → {ReplicaState: count} from ``serve.status()`` (empty until deployed)."""
    from ray import serve

    app: Any = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: dict(d.replica_states) for name, d in app.deployments.items()}


def wait_ready(url: str, cfg: KvrouteConfig, update: Callable[[str], None], app_name: str,
               timeout_s: float = 600.0) -> list[ModelState]:
    """Poll ``/health`` until 200, showing each model's ready replicas meanwhile."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = model_states(cfg, serve_replica_states(app_name))
        update(waiting_text(states))
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return model_states(cfg, serve_replica_states(app_name))
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health not ready after {timeout_s:.0f} s")
