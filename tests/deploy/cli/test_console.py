"""``kvroute up``'s console: the text is built by pure functions (no Ray), and
``divert_output`` sends everything the process writes to fds 1 and 2 into the log file
while the console keeps the original stdout (checked in a child process, since pytest
owns this process's file descriptors)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from deploy.cli.console import (
    ModelState,
    UpConsole,
    model_states,
    summary_lines,
    waiting_text,
)
from deploy.config import KvrouteConfig


def _cfg() -> KvrouteConfig:
    return KvrouteConfig.model_validate({"models": [
        {"name": "tiny-llama", "engine": "mlx", "model_path": "x", "num_replicas": 2},
        {"name": "coder", "engine": "sim", "model_path": "x",
         "autoscaling": {"min_replicas": 1, "max_replicas": 4}},
    ]})


def test_model_states_count_running_replicas_only() -> None:
    states = model_states(_cfg(), {"tiny-llama": {"RUNNING": 1, "STARTING": 1}})
    assert states == [ModelState("tiny-llama", "mlx", 1, 2), ModelState("coder", "sim", 0, 1)]
    assert waiting_text(states) == "starting replicas: tiny-llama 1/2, coder 0/1"


def test_summary_has_one_line_per_model_with_replicas_and_url() -> None:
    states = [ModelState("tiny-llama", "mlx", 2, 2), ModelState("coder", "sim", 1, 1)]
    log = Path("/tmp/kvroute/up.log")
    lines = summary_lines("http://127.0.0.1:8000", states, 12.34, log)
    assert lines[0] == "kvroute is serving at http://127.0.0.1:8000  (healthy after 12.3 s)"
    model_lines = [line for line in lines if "replicas ready" in line]
    assert len(model_lines) == 2
    assert "tiny-llama" in model_lines[0] and "2/2 replicas ready" in model_lines[0]
    assert "coder" in model_lines[1] and "1/1 replicas ready" in model_lines[1]
    assert all("http://127.0.0.1:8000/v1" in line for line in model_lines)
    assert any(str(log) in line for line in lines)
    assert not any("logs" in line for line in summary_lines("u", states, 1.0, None))


def test_steps_print_plain_lines_on_a_pipe(tmp_path: Path) -> None:
    out = tmp_path / "screen.txt"
    with out.open("w") as stream:
        ui = UpConsole(stream)
        with ui.step("starting Ray") as update:
            update("still starting")
        ui.say("kvroute is serving at http://127.0.0.1:8000")
    text = out.read_text()
    assert "✓ starting Ray (" in text
    assert "kvroute is serving at http://127.0.0.1:8000" in text
    assert "\x1b[" not in text  # no terminal escapes into a pipe or file


def test_divert_output_keeps_the_screen_for_the_console(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "up.log"
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from deploy.cli.console import UpConsole, divert_output
        screen = divert_output(Path({str(log)!r}))
        print("ray says hello")
        sys.stderr.write("serve access line\\n")
        os.write(2, b"raw fd 2\\n")
        UpConsole(screen).say("for the person")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True, cwd=Path(__file__).parents[3])
    assert done.stdout == "for the person\n" and done.stderr == ""
    logged = log.read_text()
    assert all(s in logged for s in ("ray says hello", "serve access line", "raw fd 2"))
