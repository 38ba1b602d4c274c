"""``kvroute bench <name>`` (``ops/bench/cli.py``): every bench is a subcommand whose options
parse, reached the same way through ``python -m ops.bench``; a bench's module is imported
only when its subcommand is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cli.main import build_parser
from ops.bench.__main__ import main as bench_main
from ops.bench.cli import BENCHES, MICRO

NAMES = [[b.name] for b in BENCHES] + [["micro", b.name] for b in MICRO]
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", NAMES, ids=" ".join)
def test_every_bench_has_help(name: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["bench", *name, "--help"])
    assert done.value.code == 0
    assert f"kvroute bench {' '.join(name)}" in capsys.readouterr().out


@pytest.mark.parametrize("bench", [*BENCHES, *MICRO], ids=lambda b: b.name)
def test_each_subcommand_runs_its_module(bench: object) -> None:
    import importlib

    name = [bench.name] if bench in BENCHES else ["micro", bench.name]  # type: ignore[attr-defined]
    required = {"autoscale-pool": ["x.json"], "cpu-profile": ["--out", "p"],
                "index": ["--redis-url", "redis://127.0.0.1:1/0"]}
    argv = required.get(bench.name, [])  # type: ignore[attr-defined]
    args = build_parser().parse_args(["bench", *name, *argv])
    assert args.func is importlib.import_module(bench.module).run  # type: ignore[attr-defined]


def test_load_mode_and_unknown_names() -> None:
    from ops.bench import load

    args = build_parser().parse_args(["bench", "--url", "http://127.0.0.1:1", "--rate", "2"])
    assert args.func is load.run and args.rate == 2.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "nosuch"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "micro"])  # needs a micro bench's name


def test_kvroute_imports_no_bench_module() -> None:
    """Building kvroute's parser (every ``kvroute`` command does) loads no bench: they
    import Ray, numpy and the router at import time."""
    code = ("import sys; from deploy.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith('ops.bench.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    shared = ["ops.bench.cli", "ops.bench.harness", "ops.bench.harness.args", "ops.bench.load"]
    assert out.strip() == repr(shared)


def test_python_m_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["micro", "index-cost", "20"]) == 0
    assert "| 20 |" in capsys.readouterr().out
    done = subprocess.run([sys.executable, "-m", "ops.bench", "lease-model", "--help"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and "--policies" in done.stdout
