"""``kvroute bench --url URL``: the load generator and trace replay against a running server.

    kvroute bench --url http://127.0.0.1:8000 --workload agent --concurrency 16 \\
        --duration 120 --out agent.json --plot plots/
    kvroute bench --url URL --workload trace --trace ../shared/traces/mooncake_trace_1000.jsonl \\
        --speedup 2 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ops.bench.harness.args import agent_params, console, load_arguments, load_spec, write_results

if TYPE_CHECKING:
    from ops.bench.harness.client import Record
    from ops.bench.harness.workloads import AgentParams


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    load_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not args.url:
        raise SystemExit("kvroute bench: --url is required (or use `bench compare`)")
    if args.workload == "trace" and not args.trace:
        raise SystemExit("--workload trace needs --trace FILE")
    bench, records = asyncio.run(_bench(args))
    from ops.bench.harness import report

    report.validate(bench)
    console().print(report.rich_table({bench["policy"]: bench}, title=f"{args.workload} bench"))
    write_results(args, {bench["policy"]: bench}, {bench["policy"]: records}, bench)
    return 0 if bench["errors"] == 0 else 1


async def _bench(args: argparse.Namespace) -> tuple[dict[str, Any], list[Record]]:
    from ops.bench.harness import client as cl
    from ops.bench.harness import workloads as wl
    from ops.bench.harness.report import bench_json

    model = args.model or await cl.fetch_model(args.url)
    spec = load_spec(args, args.concurrency)
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


async def _agent_window(args: argparse.Namespace, model: str) -> AgentParams:
    """The agent params with the server's context window, so sessions compact below it;
    kvroute's /v1/models does not report one, so its deploy default stands in."""
    from deploy.config import ModelConfig
    from ops.bench.harness import client as cl
    from ops.bench.harness.workloads import with_context

    window = await cl.fetch_context_window(args.url, model)
    default = ModelConfig.model_fields["context_window"].default
    return with_context(agent_params(args), window or default)


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
