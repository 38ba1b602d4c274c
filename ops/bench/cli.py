"""``kvroute bench``: load against a URL, ``bench compare`` of routers, ``bench index``,
``bench engines``.

    kvroute bench --url http://127.0.0.1:8000 --workload agent --concurrency 16 \\
        --duration 120 --out agent.json --plot plots/
    kvroute bench --url URL --workload trace --trace ../shared/traces/mooncake_trace_1000.jsonl \\
        --speedup 2 --duration 60
    kvroute bench compare --engine sim --replicas 4 --workload agent --duration 180 \\
        --out compare.json --plot plots/
    kvroute bench index --redis-url redis://127.0.0.1:6379/0     (see ops.bench.index)
    kvroute bench engines --engine sim mlx                       (see ops.bench.engines)
    kvroute bench autoscale --engine sim --policy kvroute --duration 180 --out kv.json
                                                                 (see ops.bench.autoscale.bench)

Options of a mode go after its name (``kvroute bench compare --duration 10``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

# bench compare's default load: 20 concurrent agent sessions keep 4 sim replicas (P = 4000
# tok/s) about 70-75 % prefill-busy under kvroute (docs/benchmarks.md).
DEFAULT_CONCURRENCY = 20


def _load_args(p: argparse.ArgumentParser) -> None:
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


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="load generator and trace replay against a URL; compare routers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", help="base URL of an OpenAI-compatible server")
    p.add_argument("--model", help="model to request (default: the first of /v1/models)")
    p.add_argument("--label", default="", help="the policy name written in the JSON")
    p.add_argument("--replicas", type=int, help="for the JSON (default: kvroute's count)")
    p.add_argument("--prefill-tok-s", type=float, help="engine prefill rate, for busy%%")
    p.add_argument("--vocab-size", type=int, default=4096, help="trace: token ids below this")
    p.add_argument("--max-requests", type=int, help="trace: replay only the first N")
    p.add_argument("--max-context", type=int,
                   help="trace: leave out requests whose input + output exceed this")
    p.add_argument("--salt", default="", help="prefix every prompt (isolates runs' caches)")
    p.add_argument("--identity-headers", action="store_true",
                   help="agent: send Claude Code's session and sub-agent headers per session")
    _load_args(p)
    p.set_defaults(func=cmd_bench)
    modes = p.add_subparsers(dest="bench_mode", metavar="{compare,router,index,engines}")
    c = modes.add_parser(
        "compare", help="kvroute vs peer routers (sglang-router, smg, vllm-router) on the "
        "same replicas",
        description=_compare_doc(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--engine", choices=["sim", "mlx", "vllm"], default="sim")
    c.add_argument("--replicas", type=int, default=4)
    c.add_argument("--model-path", help="model folder (default: the tiny offline model)")
    c.add_argument("--port", type=int, default=0, help="Serve HTTP port (0: a free one)")
    c.add_argument("--prefill-tok-s", type=float, default=4000.0, help="sim: P, tok/s")
    c.add_argument("--tpot-ms", type=float, default=20.0, help="sim: decode step at batch 1")
    c.add_argument("--kv-blocks", type=int, default=4096, help="sim: 64-token blocks / replica")
    c.add_argument("--overhead-samples", type=int, default=300)
    c.add_argument("--routers", default=DEFAULT_ROUTERS,
                   help=f"comma-separated, or `all`: {','.join(_routers())}")
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
    c.add_argument("--sglang-args", default="",
                   help="extra sglang-router flags for the cache_aware run (default: none)")
    _load_args(c)
    c.set_defaults(func=cmd_compare)
    r = modes.add_parser("router", help="router CPU and added latency, prompt cache off vs on",
                         description=_router_doc(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _router_args(r)
    i = modes.add_parser("index", help="Redis prefix-index latency vs PING (ops.bench.index)")
    from ops.bench import index as bench_index

    bench_index.add_arguments(i)
    i.set_defaults(func=bench_index.run)
    _engines_parser(modes)
    _autoscale_parser(modes)


def _autoscale_parser(modes: argparse._SubParsersAction) -> None:
    from ops.bench.autoscale import bench as autoscale
    from ops.bench.autoscale import options as autoscale_cli

    a = modes.add_parser("autoscale", help="bursty load on an autoscaled model: kvroute's "
                         "policy or Serve's default (ops.bench.autoscale.bench)",
                         description=autoscale.__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    autoscale_cli.add_arguments(a)
    a.set_defaults(func=autoscale_cli.run)


def _engines_parser(modes: argparse._SubParsersAction) -> None:
    from ops.bench import engines as bench_engines

    e = modes.add_parser("engines", help="cold/warm TTFT and tok/s per engine (ops.bench.engines)",
                         description=bench_engines.__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_engines.add_arguments(e)
    e.set_defaults(func=bench_engines.run)


def _router_doc() -> str:
    from ops.bench.router import bench as router_bench

    return router_bench.__doc__ or ""


def _router_args(r: argparse.ArgumentParser) -> None:
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
    from ops.bench.router import scenarios as router_scenarios

    router_scenarios.add_arguments(r)
    r.set_defaults(func=cmd_router)


def cmd_router(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    from ops.bench.router import bench as rb
    from ops.bench.router import scenarios as router_scenarios
    from ops.models.tiny_model import ensure_model

    model = args.model_path or str(ensure_model())
    if args.move or args.agent or args.stall or args.specials:  # not the length table
        result, text = router_scenarios.cli(args, model)
    else:
        spec = rb.quick(rb.RouterBenchSpec()) if args.quick else rb.RouterBenchSpec()
        upd: dict[str, Any] = {k: getattr(args, k) for k in ("repeats", "turns", "cold")
                               if getattr(args, k) is not None}
        if args.lengths:
            upd["lengths"] = tuple(int(x) for x in args.lengths.split(","))
        upd["modes"] = tuple(m for m in args.modes.split(",") if m in rb.MODES)
        result = rb.run(replace(spec, **upd), model, show=not args.quiet)
        text = rb.markdown(result)
    result["command"] = "kvroute bench " + shlex.join(sys.argv[sys.argv.index("router"):]) \
        if "router" in sys.argv else "kvroute bench router"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    return 0


DEFAULT_ROUTERS = "kvroute,round-robin,sglang-router"


def _compare_doc() -> str:
    from ops.bench.compare import bench as compare

    return compare.__doc__ or ""


def _routers() -> tuple[str, ...]:
    from ops.bench.compare.bench import ROUTERS

    return ROUTERS


def _agent_params(args: argparse.Namespace) -> Any:
    from ops.bench.harness.workloads import AgentParams, override_params

    return override_params(AgentParams(), args.seed, args.agent)


def _spec(args: argparse.Namespace, concurrency: int | None) -> Any:
    from ops.bench.harness.client import LoadSpec

    return LoadSpec(duration_s=args.duration, concurrency=concurrency, rate=args.rate,
                    speedup=args.speedup, ramp_s=args.ramp, seed=args.seed,
                    drain_timeout_s=args.drain_timeout)


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


# -- kvroute bench --url -----------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    if not args.url:
        raise SystemExit("kvroute bench: --url is required (or use `bench compare`)")
    if args.workload == "trace" and not args.trace:
        raise SystemExit("--workload trace needs --trace FILE")
    bench, records = asyncio.run(_bench(args))
    from ops.bench.harness import report

    report.validate(bench)
    _console().print(report.rich_table({bench["policy"]: bench}, title=f"{args.workload} bench"))
    _write(args, {bench["policy"]: bench}, {bench["policy"]: records}, bench)
    return 0 if bench["errors"] == 0 else 1


async def _bench(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    from ops.bench.harness import client as cl
    from ops.bench.harness import workloads as wl
    from ops.bench.harness.report import bench_json

    model = args.model or await cl.fetch_model(args.url)
    spec = _spec(args, args.concurrency)
    params: dict[str, Any] = {"url": args.url, "model": model, "salt": args.salt,
                              "load": asdict(spec)}
    if args.workload == "agent":
        agent = await _agent_window(args, model)
        driver = cl.agent_driver(wl.AgentWorkload(agent, args.salt), spec)
        params["agent"] = agent.to_dict()
    else:
        items = wl.trace_requests(args.trace, args.vocab_size, args.salt, args.max_requests,
                                  args.max_context)
        driver = cl.trace_driver(items, spec)
        params.update(trace=str(args.trace), vocab_size=args.vocab_size,
                      max_context=args.max_context, speedup=args.speedup)
    replicas = args.replicas if args.replicas is not None else await _count_replicas(args.url)
    label = args.label or "server"
    async with cl.Client(args.url, model, identity=args.identity_headers) as client:
        records = await cl.Runner(client, spec, label, not args.quiet).run(driver)
    bench = bench_json(records, workload=args.workload, policy=label, replicas=replicas,
                       params=params, prefill_tok_s=args.prefill_tok_s)
    return bench, records


async def _agent_window(args: argparse.Namespace, model: str) -> Any:
    """The agent params with the server's context window, so sessions compact below it;
    kvroute's /v1/models does not report one, so its deploy default stands in."""
    from deploy.config import ModelConfig
    from ops.bench.harness import client as cl
    from ops.bench.harness.workloads import with_context

    window = await cl.fetch_context_window(args.url, model)
    default = ModelConfig.model_fields["context_window"].default
    return with_context(_agent_params(args), window or default)


async def _count_replicas(url: str) -> int:
    """kvroute's worker replica count from /kvroute/replicas; 0 for other servers."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/kvroute/replicas") as r:
            if r.status != 200:
                return 0
            models = (await r.json()).get("models", {})
            return sum(len(v) for v in models.values())
    except (aiohttp.ClientError, ValueError):
        return 0


# -- kvroute bench compare ---------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    if args.workload == "trace" and not args.trace:
        raise SystemExit("--workload trace needs --trace FILE")
    counts = tuple(int(n) for n in args.router_replicas.split(",") if n.strip())
    routers = _routers() if args.routers.strip() == "all" else \
        tuple(r.strip() for r in args.routers.split(",") if r.strip())
    if counts and args.routers == DEFAULT_ROUTERS:
        from ops.bench.compare.scaling import SCALED

        routers = SCALED
    if args.workload == "trace":
        from ops.bench.compare.bench import TOKEN_ID_ROUTERS

        if refused := [r for r in routers if r not in TOKEN_ID_ROUTERS]:
            print(f"trace replay sends token-id prompts, which {', '.join(refused)} refuse: "
                  "left out", file=sys.stderr)
        routers = tuple(r for r in routers if r in TOKEN_ID_ROUTERS)
    unknown = set(routers) - set(_routers())
    if unknown:
        raise SystemExit(f"--routers: unknown {sorted(unknown)}")
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray loads
    # Serve's per-request logs stay in their files instead of streaming to this process.
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    from deploy.serve import runtime
    from ops.bench.compare.bench import CompareSpec, run_compare

    concurrency = args.concurrency or (None if args.rate else DEFAULT_CONCURRENCY)
    spec = CompareSpec(
        engine=args.engine, replicas=args.replicas, load=_spec(args, concurrency),
        agent=_agent_params(args), model_path=args.model_path,
        port=args.port, ingress=args.ingress, overhead_samples=args.overhead_samples,
        routers=routers,
        sglang_args=tuple(shlex.split(args.sglang_args)),
        trace=args.trace if args.workload == "trace" else None,
        vocab_size=args.vocab_size, max_context=args.max_context,
        sim={"prefill_tok_s": args.prefill_tok_s, "tpot_s": args.tpot_ms / 1000.0,
             "tpot_per_batch_s": 0.0002, "kv_blocks": args.kv_blocks},
    )
    runtime.init_ray("127.0.0.1", num_cpus=max(4, args.replicas + 2 + max(counts or (0,))))
    try:
        if counts:
            return _scaling(args, spec, counts)
        result, records = run_compare(spec, show=not args.quiet)
    finally:
        runtime.shutdown()
    result["command"] = _command()
    _print_compare(result)
    _write(args, result["routers"], records, result)
    if args.markdown:
        from ops.bench.harness.report import markdown_compare

        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_compare(result))
    goals = result["goals"]
    return 0 if goals["zero_errors"] and goals["all_served"] else 1


def _command() -> str:
    return "kvroute bench " + shlex.join(sys.argv[sys.argv.index("compare"):]) \
        if "compare" in sys.argv else "kvroute bench compare"


def _scaling(args: argparse.Namespace, spec: Any, counts: tuple[int, ...]) -> int:
    from ops.bench.compare import scaling
    from ops.bench.compare.bench import environment
    from ops.bench.harness.report import rich_table

    result, records = scaling.run_scaling(spec, counts, show=not args.quiet)
    result.update(command=_command(), env=environment())
    runs = {f"{name}@{n}": b for n, by in result["router_replicas"].items()
            for name, b in by.items()}
    _console().print(rich_table(runs, title="router replicas (TTFT in s)"))
    _console().print(f"cached ratio drop, points: {result['cached_ratio_drop_points']}")
    _write(args, runs, records, result)
    if args.markdown:
        from ops.bench.harness.report import markdown_table

        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"Command: `{result['command']}`\n\n"
                                 f"{markdown_table(runs)}\n")
    return 0 if all(b["errors"] == 0 for b in runs.values()) else 1


def _print_compare(result: dict[str, Any]) -> None:
    from ops.bench.harness.report import rich_table

    console = _console()
    console.print(rich_table(result["routers"], title="bench compare (TTFT/TPOT/E2E in s)"))
    for key in ("router_overhead_s", "serve_proxy_overhead_s"):
        o = result[key]
        console.print(f"{key}: p50 {1000 * o['p50']:.2f} ms  p99 {1000 * o['p99']:.2f} ms")
    console.print("goals: " + "  ".join(
        f"{k} {'[green]ok[/]' if v else '[red]MISSED[/]'}" for k, v in result["goals"].items()))


def _write(args: argparse.Namespace, benches: dict[str, Any], records: dict[str, Any],
           result: dict[str, Any]) -> None:
    from ops.bench.harness import report

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.json_text(result) + "\n")
    if args.plot:
        title = f"{args.workload}: " + (", ".join(benches) if len(benches) <= 3
                                        else f"{len(benches)} runs")
        report.plot_ttft_cdf(records, args.plot / "ttft_cdf.png", f"TTFT CDF ({title})")
        report.plot_cached_ratio(records, args.plot / "cached_ratio.png",
                                 f"cached token ratio over time ({title})")
        if all("cpu_s_per_request" in b for b in benches.values()):
            report.plot_cpu(benches, args.plot / "cpu_per_request.png",
                            f"CPU per request ({title})")
