"""Third-party benchmark clients the test suite runs against kvroute (``tests/e2e/
test_bench_tools.py``): each in a venv of its own under ``~/.cache/kvroute/tools/<package>-
<version>`` (``KVROUTE_TOOL_CACHE`` overrides the folder), installed by pip on first use,
as the peer routers are (``ops.bench.compare.peers``). aiperf pins versions of psutil,
rich, pyzmq and others that the project's venv holds at other versions, so it cannot share
it. ``vllm bench serve`` comes with the vLLM venv (``make vllm-deps``).

    python -m ops.bench.tools   # install them ahead (make bench-tools); prints the seconds
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ops.bench.compare.peers import install_venv

TOOLS = {"aiperf": "0.13.0"}


def tool_cache() -> Path:
    return Path(os.environ.get("KVROUTE_TOOL_CACHE", "~/.cache/kvroute/tools")).expanduser()


def ensure_tool(package: str) -> Path:
    """The tool's venv ``bin``, installed first if missing."""
    venv = tool_cache() / f"{package}-{TOOLS[package]}"
    pip = [str(venv / "bin" / "pip"), "install", "-q", f"{package}=={TOOLS[package]}"]
    return install_venv(venv, package, [pip])


def main() -> int:
    for package in TOOLS:
        start = time.monotonic()
        bin_dir = ensure_tool(package)
        marker = bin_dir.parent / ".kvroute-installed"
        print(f"{package} {TOOLS[package]}: {bin_dir} (installed in {marker.read_text().strip()}"
              f" s; this call {time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
