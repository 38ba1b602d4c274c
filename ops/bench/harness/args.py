"""The options ``kvroute bench --url`` (load mode) and ``bench compare`` share, what they
build from them (the load, the agent's parameters) and how both write their results."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from ops.bench.harness.client import LoadSpec, Record
    from ops.bench.harness.workloads import AgentParams


def load_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=["agent", "trace"], default="agent")
    p.add_argument("--trace", help="Mooncake JSONL (for --workload trace)")
    p.add_argument("--speedup", type=float, default=1.0, help="trace: timestamps / S")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--concurrency", type=int, help="closed loop: N sessions (or requests)")
    loop.add_argument("--rate", type=float, help="open loop: sessions (or requests) per s")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of sending")
    p.add_argument("--ramp", type=float, default=10.0, help="closed loop: start slots over S")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="wait for in-flight")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument("--agent", action="append", default=[], metavar="KEY=VALUE",
                   help="override an AgentParams field (ops.bench.harness.workloads), repeatable")
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def agent_params(args: argparse.Namespace) -> AgentParams:
    from ops.bench.harness.workloads import AgentParams, override_params

    return override_params(AgentParams(), args.seed, args.agent)


def load_spec(args: argparse.Namespace, concurrency: int | None) -> LoadSpec:
    from ops.bench.harness.client import LoadSpec

    return LoadSpec(duration_s=args.duration, concurrency=concurrency, rate=args.rate,
                    speedup=args.speedup, ramp_s=args.ramp, seed=args.seed,
                    drain_timeout_s=args.drain_timeout)


def command_line(name: str) -> str:
    """The command as typed from the bench's name on, for the JSON's ``command``."""
    return "kvroute bench " + shlex.join(sys.argv[sys.argv.index(name):]) \
        if name in sys.argv else f"kvroute bench {name}"


def console() -> Console:
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=160)


def write_results(args: argparse.Namespace, benches: dict[str, Any],
                  records: dict[str, list[Record]], result: dict[str, Any]) -> None:
    """``--out``: the result JSON; ``--plot``: the TTFT CDF, cached ratio and CPU plots."""
    from ops.bench.harness import report

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.json_text(result) + "\n")
    if not args.plot:
        return
    title = f"{args.workload}: " + (", ".join(benches) if len(benches) <= 3
                                    else f"{len(benches)} runs")
    report.plot_ttft_cdf(records, args.plot / "ttft_cdf.png", f"TTFT CDF ({title})")
    report.plot_cached_ratio(records, args.plot / "cached_ratio.png",
                             f"cached token ratio over time ({title})")
    if all("cpu_s_per_request" in b for b in benches.values()):
        report.plot_cpu(benches, args.plot / "cpu_per_request.png", f"CPU per request ({title})")
