"""``kvroute bench overhead``'s options, table and command (the run:
``ops.bench.overhead.bench``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ops.bench.overhead.workload import MODES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["mlx", "vllm"], default="mlx")
    p.add_argument("--replicas", type=int, choices=[1, 2], default=1)
    p.add_argument("--model-path", help="model folder (default: the tiny offline model)")
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated closed-loop levels")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {MODES}")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--prefix-tokens", type=int, default=96, help="shared mode: common prefix")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="bare/kvroute pairs per cell")
    p.add_argument("--cell-duration", type=float, default=20.0, help="seconds per run")
    p.add_argument("--stream-interval-ms", type=float, default=0.0,
                   help="kvroute's stream pacing (0: a chunk per token, as the bare servers)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--markdown", type=Path, help="also write the table here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def spec_of(args: argparse.Namespace) -> Any:
    from ops.bench.overhead.bench import OverheadSpec
    from ops.bench.overhead.targets import EngineSettings
    from ops.bench.overhead.workload import Workload
    from ops.models.tiny_model import ensure_model

    settings = EngineSettings(args.engine, args.model_path or str(ensure_model()))
    return OverheadSpec(
        settings=settings, replicas=args.replicas,
        workload=Workload(args.prompt_tokens, args.prefix_tokens, args.max_tokens),
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        concurrencies=tuple(int(c) for c in args.concurrency.split(",") if c.strip()),
        rounds=args.rounds, cell_s=args.cell_duration,
        stream_interval_ms=args.stream_interval_ms)


def run(args: argparse.Namespace) -> int:
    from ops.bench.harness.args import command_line, console
    from ops.bench.harness.report import json_text
    from ops.bench.harness.stack import with_fresh_ray
    from ops.bench.overhead.bench import run_overhead

    spec = spec_of(args)
    result = with_fresh_ray(lambda: run_overhead(spec, show=not args.quiet))
    result["command"] = command_line("overhead")
    table = markdown(result)
    console().print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json_text(result) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n")
    return 0 if result["goals"]["zero_errors"] else 1


def markdown(result: dict[str, Any]) -> str:
    """One row per cell: both targets' figures and kvroute over bare."""
    head = ("| mode | conc | bare tok/s | kvroute tok/s | ratio | bare TTFT p50 / p99 ms | "
            "kvroute TTFT p50 / p99 ms | TTFT p50 delta ms | bare / kvroute ITL p50 ms | "
            "hit% bare / kvroute | requests bare / kvroute |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in result["cells"]:
        b, k, r = c["bare"], c["kvroute"], c["ratios"]
        lines.append(
            f"| {c['mode']} | {c['concurrency']} | {b['throughput_tok_s']:.1f} | "
            f"{k['throughput_tok_s']:.1f} | {r['throughput']:.3f} | "
            f"{1000 * b['ttft_s']['p50']:.0f} / {1000 * b['ttft_s']['p99']:.0f} | "
            f"{1000 * k['ttft_s']['p50']:.0f} / {1000 * k['ttft_s']['p99']:.0f} | "
            f"{1000 * r['ttft_p50_delta_s']:+.1f} | "
            f"{1000 * b['itl_s']['p50']:.1f} / {1000 * k['itl_s']['p50']:.1f} | "
            f"{100 * b['cached_token_ratio']:.0f} / {100 * k['cached_token_ratio']:.0f} | "
            f"{b['requests']} / {k['requests']} |")
    o = result["ratios"]
    lines.append(f"\nOverall (kvroute over bare): throughput x{o['throughput']:.3f} "
                 f"(geometric mean of the cells), TTFT p50 {1000 * o['ttft_p50_delta_s']:+.1f} ms "
                 f"(median of the cells); load average {result['load_avg']['start'][0]:.1f} "
                 f"at the start, {result['load_avg']['end'][0]:.1f} at the end.")
    return "\n".join(lines)
