"""A bench stack (one router replica over one sim replica, its own local Ray) run by the
code of whatever tree is first on ``PYTHONPATH``, so one bench run can compare two
checkouts: ``kvroute bench router --agent --agent-base <worktree>`` starts "before" with
the other tree's code and "after" with this one, each in a child process running this
file by path.

Only ``ops.bench.harness.stack`` and ``ops.bench.compare.bench`` (``CompareSpec``,
``build_config``) are imported from the tree under test, so a base tree must have this
layout of ops/bench (the commit that made ``harness/`` or later).
Protocol: argv[1] is a JSON object of ``CompareSpec`` fields and ``model_path``; the child
prints ``URL <url>`` once the stack is healthy and tears it down when its stdin closes.

    PYTHONPATH=<tree> python ops/bench/router/tree_stack.py '{"model_path": "...", ...}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class StackStartError(RuntimeError):
    """The child's stack did not come up (e.g. Ray's start-up timed out)."""


def main(argv: list[str]) -> int:
    from ops.bench.compare.bench import CompareSpec, build_config
    from ops.bench.harness.procs import free_port
    from ops.bench.harness.stack import stack

    spec = json.loads(argv[1])
    model_path = spec.pop("model_path")
    with stack(build_config(CompareSpec(**spec), model_path, free_port())) as url:
        print(f"URL {url}", flush=True)
        sys.stdin.read()  # until the parent closes it
    return 0


@contextmanager
def tree_stack(tree: Path, spec: dict[str, object], env: dict[str, str]) -> Iterator[str]:
    """(parent side) The URL of a stack run by ``tree``'s code in a child process."""
    child_env = {**os.environ, **env, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env, cwd=str(tree))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("URL "):
                yield line.split(None, 1)[1].strip()
                break
        else:
            raise StackStartError(f"the stack of {tree} did not start (exit {proc.wait()})")
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # run by path: ops/bench's modules must not shadow top-level names
    sys.exit(main(sys.argv))
