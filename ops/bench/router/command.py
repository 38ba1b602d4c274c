"""``kvroute bench router``'s options and command: the length table (``bench``) or, by
flag, one of the scenarios (``scenarios``: ``--move``, ``--agent``, ``--stall``,
``--specials``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ops.bench.harness.args import command_line


def add_arguments(r: argparse.ArgumentParser) -> None:
    from ops.bench.router import scenarios

    r.add_argument("--quick", action="store_true", help="short lengths and counts (~3 min)")
    r.add_argument("--lengths", help="comma-separated prompt lengths in tokens")
    r.add_argument("--repeats", type=int, help="(a) requests of the same prompt per length")
    r.add_argument("--turns", type=int, help="(b) turns of the growing session")
    r.add_argument("--cold", type=int, help="(c) cold prompts per length")
    r.add_argument("--modes", default="before,after", help="before (cache off), after")
    r.add_argument("--model-path", help="model folder (default: the tiny offline model)")
    r.add_argument("--out", type=Path, help="write the JSON here")
    r.add_argument("--markdown", type=Path, help="also write the tables as markdown here")
    r.add_argument("--quiet", action="store_true")
    scenarios.add_arguments(r)


def run(args: argparse.Namespace) -> int:
    from ops.bench.harness.stack import bench_env
    from ops.bench.router import scenarios
    from ops.models.tiny_model import ensure_model

    bench_env()
    model = args.model_path or str(ensure_model())
    if args.move or args.agent or args.stall or args.specials:  # not the length table
        result, text = scenarios.cli(args, model)
    else:
        result, text = _table(args, model)
    result["command"] = command_line("router")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    return 0


def _table(args: argparse.Namespace, model: str) -> tuple[dict[str, Any], str]:
    from ops.bench.router import bench as rb

    spec = rb.quick(rb.RouterBenchSpec()) if args.quick else rb.RouterBenchSpec()
    upd: dict[str, Any] = {k: getattr(args, k) for k in ("repeats", "turns", "cold")
                           if getattr(args, k) is not None}
    if args.lengths:
        upd["lengths"] = tuple(int(x) for x in args.lengths.split(","))
    upd["modes"] = tuple(m for m in args.modes.split(",") if m in rb.MODES)
    result = rb.run(replace(spec, **upd), model, show=not args.quiet)
    return result, rb.markdown(result)
