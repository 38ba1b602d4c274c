"""``kvroute bench compare``'s options and command (the run: ``ops.bench.compare.bench``;
``--router-replicas``: ``ops.bench.compare.scaling``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from ops.bench.compare.bench import ROUTERS, TOKEN_ID_ROUTERS, CompareSpec
from ops.bench.harness.args import (
    agent_params,
    command_line,
    console,
    load_arguments,
    load_spec,
    write_results,
)

# bench compare's default load: 20 concurrent agent sessions keep 4 sim replicas (P = 4000
# tok/s) about 70-75 % prefill-busy under kvroute (docs/benchmarks.md).
DEFAULT_CONCURRENCY = 20
DEFAULT_ROUTERS = "kvroute,round-robin,sglang-router"


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--engine", choices=["sim", "mlx", "vllm"], default="sim")
    c.add_argument("--replicas", type=int, default=4)
    c.add_argument("--model-path", help="model folder (default: the tiny offline model)")
    c.add_argument("--port", type=int, default=0, help="Serve HTTP port (0: a free one)")
    c.add_argument("--prefill-tok-s", type=float, default=4000.0, help="sim: P, tok/s")
    c.add_argument("--tpot-ms", type=float, default=20.0, help="sim: decode step at batch 1")
    c.add_argument("--kv-blocks", type=int, default=4096, help="sim: 64-token blocks / replica")
    c.add_argument("--overhead-samples", type=int, default=300)
    c.add_argument("--routers", default=DEFAULT_ROUTERS,
                   help=f"comma-separated, or `all`: {','.join(ROUTERS)}")
    c.add_argument("--markdown", type=Path, help="also write a markdown report here")
    c.add_argument("--vocab-size", type=int, default=4096, help="trace: token ids below this")
    c.add_argument("--max-context", type=int, default=131072,
                   help="trace: leave out requests longer than this (the deployment's window)")
    c.add_argument("--router-replicas", default="",
                   help="e.g. 1,2,4: run kvroute (shared index), smg and vllm-router at each "
                   "count of router replicas instead (ops.bench.compare.scaling)")
    c.add_argument("--ingress", choices=("auto", "proxy", "direct"), default="auto",
                   help="kvroute's server.ingress: through Serve's proxy, or each router "
                   "replica listening itself (auto, the default, is direct here)")
    c.add_argument("--stream-interval-ms", type=float, default=None,
                   help="the model's stream pacing (models[].stream_interval_ms; default: "
                   "kvroute's, 0, a chunk per token)")
    c.add_argument("--sglang-args", default="",
                   help="extra sglang-router flags for the cache_aware run (default: none)")
    load_arguments(c)


def routers_of(args: argparse.Namespace, counts: tuple[int, ...]) -> tuple[str, ...]:
    """``--routers`` read: ``all``, the scaled set under ``--router-replicas`` by default,
    and on a trace only the routers that take token-id prompts."""
    routers = ROUTERS if args.routers.strip() == "all" else \
        tuple(r.strip() for r in args.routers.split(",") if r.strip())
    if counts and args.routers == DEFAULT_ROUTERS:
        from ops.bench.compare.scaling import SCALED

        routers = SCALED
    if args.workload == "trace":
        if refused := [r for r in routers if r not in TOKEN_ID_ROUTERS]:
            print(f"trace replay sends token-id prompts, which {', '.join(refused)} refuse: "
                  "left out", file=sys.stderr)
        routers = tuple(r for r in routers if r in TOKEN_ID_ROUTERS)
    if unknown := set(routers) - set(ROUTERS):
        raise SystemExit(f"--routers: unknown {sorted(unknown)}")
    return routers


def compare_spec(args: argparse.Namespace, routers: tuple[str, ...]) -> CompareSpec:
    concurrency = args.concurrency or (None if args.rate else DEFAULT_CONCURRENCY)
    return CompareSpec(
        engine=args.engine, replicas=args.replicas, load=load_spec(args, concurrency),
        agent=agent_params(args), model_path=args.model_path,
        port=args.port, ingress=args.ingress, overhead_samples=args.overhead_samples,
        stream_interval_ms=args.stream_interval_ms,
        routers=routers, sglang_args=tuple(shlex.split(args.sglang_args)),
        trace=args.trace if args.workload == "trace" else None,
        vocab_size=args.vocab_size, max_context=args.max_context,
        sim={"prefill_tok_s": args.prefill_tok_s, "tpot_s": args.tpot_ms / 1000.0,
             "tpot_per_batch_s": 0.0002, "kv_blocks": args.kv_blocks},
    )


def run(args: argparse.Namespace) -> int:
    if args.workload == "trace" and not args.trace:
        raise SystemExit("--workload trace needs --trace FILE")
    counts = tuple(int(n) for n in args.router_replicas.split(",") if n.strip())
    spec = compare_spec(args, routers_of(args, counts))
    from ops.bench.compare.bench import run_compare
    from ops.bench.harness.stack import local_ray

    with local_ray(num_cpus=max(4, args.replicas + 2 + max(counts or (0,)))):
        if counts:
            return _scaling(args, spec, counts)
        result, records = run_compare(spec, show=not args.quiet)
    result["command"] = command_line("compare")
    _print_compare(result)
    write_results(args, result["routers"], records, result)
    if args.markdown:
        from ops.bench.harness.report import markdown_compare

        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_compare(result))
    goals = result["goals"]
    return 0 if goals["zero_errors"] and goals["all_served"] else 1


def _scaling(args: argparse.Namespace, spec: CompareSpec, counts: tuple[int, ...]) -> int:
    from ops.bench.compare import scaling
    from ops.bench.compare.bench import environment
    from ops.bench.harness.report import markdown_table, rich_table

    result, records = scaling.run_scaling(spec, counts, show=not args.quiet)
    result.update(command=command_line("compare"), env=environment())
    runs = {f"{name}@{n}": b for n, by in result["router_replicas"].items()
            for name, b in by.items()}
    console().print(rich_table(runs, title="router replicas (TTFT in s)"))
    console().print(f"cached ratio drop, points: {result['cached_ratio_drop_points']}")
    write_results(args, runs, records, result)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"Command: `{result['command']}`\n\n"
                                 f"{markdown_table(runs)}\n")
    return 0 if all(b["errors"] == 0 for b in runs.values()) else 1


def _print_compare(result: dict[str, Any]) -> None:
    from ops.bench.harness.report import rich_table

    out = console()
    out.print(rich_table(result["routers"], title="bench compare (TTFT/TPOT/E2E in s)"))
    for key in ("router_overhead_s", "serve_proxy_overhead_s"):
        o = result[key]
        out.print(f"{key}: p50 {1000 * o['p50']:.2f} ms  p99 {1000 * o['p99']:.2f} ms")
    out.print("goals: " + "  ".join(
        f"{k} {'[green]ok[/]' if v else '[red]MISSED[/]'}" for k, v in result["goals"].items()))
