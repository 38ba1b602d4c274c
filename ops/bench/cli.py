"""``kvroute bench``: every benchmark, one subcommand each (``python -m ops.bench ARGS`` is
the same as ``kvroute bench ARGS``). Options of a bench go after its name.

    kvroute bench --url http://127.0.0.1:8000 --workload agent --concurrency 16 \\
        --duration 120 --out agent.json --plot plots/          (load mode: ops.bench.load)
    kvroute bench compare --engine sim --replicas 4 --workload agent --duration 180 \\
        --out compare.json --plot plots/
    kvroute bench router --quick
    kvroute bench index --redis-url redis://127.0.0.1:6379/0
    kvroute bench engines --engine sim mlx
    kvroute bench autoscale --engine sim --policy kvroute --duration 180 --out kv.json
    kvroute bench autoscale-pool docs/benchmarks/autoscale-repeat*.json
    kvroute bench cpu-profile --duration 120 --idle 60 --out /tmp/prof
    kvroute bench leases --duration 90 --concurrency 8 --kv-blocks 350
    kvroute bench lease-model --sessions 24 --kv-blocks 580
    kvroute bench prewarm --duration 100 --window 60 --rounds 1
    kvroute bench kv-disk --tokens 4096
    kvroute bench failover --redis sentinel --concurrency 16 --duration 90 --out f.json
    kvroute bench node-loss --concurrency 8 --duration 60 --out node-loss.json
    kvroute bench overhead --engine mlx --replicas 1 --out overhead.json
    kvroute bench calibrate --engine mlx --out calibrate.json
    kvroute bench micro index-cost 940 2400      (also pacing-cost, stream-cost,
                                                 client-guard-cost, grammar-cost,
                                                 logprobs-cost)
    kvroute bench peers                          (installs the peer routers: make peers)

Each bench module has ``add_arguments(parser)`` and ``run(args) -> int``; this file only
names them.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Bench:
    name: str  # the subcommand
    module: str  # has add_arguments(parser) and run(args) -> int
    help: str


BENCHES = (
    Bench("compare", "ops.bench.compare.command",
          "kvroute vs peer routers (sglang-router, smg, vllm-router, dynamo) on the same "
          "replicas"),
    Bench("router", "ops.bench.router.command",
          "router CPU and added latency, prompt cache off vs on"),
    Bench("index", "ops.bench.index", "Redis prefix-index latency vs PING"),
    Bench("engines", "ops.bench.engines.command", "cold/warm TTFT and tok/s per engine"),
    Bench("autoscale", "ops.bench.autoscale.command",
          "bursty load on an autoscaled model: kvroute's policy or Serve's default"),
    Bench("autoscale-pool", "ops.bench.autoscale.pool",
          "pool repeated bench autoscale runs' JSON into one table"),
    Bench("cpu-profile", "ops.bench.cpu_profile",
          "where the router's CPU per request goes (py-spy on the compare stack)"),
    Bench("leases", "ops.bench.leases.bench", "KV leases on a live stack, off vs on"),
    Bench("lease-model", "ops.bench.leases.model", "KV lease policies in virtual time"),
    Bench("prewarm", "ops.bench.leases.prewarm",
          "a new replica's first minute with and without pre-warm"),
    Bench("kv-disk", "ops.bench.kv_disk", "mlx disk-tier reload vs re-prefill"),
    Bench("failover", "ops.bench.failover", "Redis primary killed under load (Sentinel)"),
    Bench("node-loss", "ops.bench.node_loss",
          "a node (router and worker replicas) lost and regained under load"),
    Bench("overhead", "ops.bench.overhead.command",
          "kvroute + engine against the engine's own server (mlx_lm.server, vllm serve)"),
    Bench("calibrate", "ops.bench.calibrate.command",
          "the sim emulator fitted to a real engine's curves, and its remaining error"),
    Bench("peers", "ops.bench.compare.peers", "install the peer routers' venvs"),
)
MICRO = (
    Bench("index-cost", "ops.bench.micro.index_cost",
          "the embedded prefix index's lookup and write per request"),
    Bench("pacing-cost", "ops.bench.micro.pacing_cost", "what stream pacing costs a worker"),
    Bench("stream-cost", "ops.bench.micro.stream_cost", "router CPU per streamed token"),
    Bench("client-guard-cost", "ops.bench.micro.client_guard_cost",
          "the client guard middleware's cost per request"),
    Bench("grammar-cost", "ops.bench.micro.grammar_cost",
          "constrained decoding: grammar libraries' compile and mask cost, mlx decode"),
    Bench("logprobs-cost", "ops.bench.micro.logprobs_cost",
          "mlx decode tokens/s without logprobs and with top_logprobs 0, 5, 20"),
)


class LazyParser(argparse.ArgumentParser):
    """A bench's parser, filled from its module when it is used: ``kvroute up`` and
    ``kvroute --help`` import no bench (several import Ray, numpy or the router)."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.module = module

    def load(self) -> None:
        if self.module is None:
            return
        module = importlib.import_module(self.module)
        self.module, self.description = None, module.__doc__
        module.add_arguments(self)
        self.set_defaults(func=module.run)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.load()
        return super().format_help()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ops.bench import load

    p = subparsers.add_parser(
        "bench", help="every benchmark: load against a URL, compare routers, ...",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load.add_arguments(p)
    p.set_defaults(func=load.run)
    names = [b.name for b in BENCHES] + ["micro"]
    modes = p.add_subparsers(dest="bench_mode", metavar="{" + ",".join(names) + "}",
                             parser_class=LazyParser)
    for bench in BENCHES:
        add_bench(modes, bench)
    micro = modes.add_parser("micro", help="in-process costs, one call site each",
                             description="In-process costs, measured with harness.micro.")
    inner = micro.add_subparsers(dest="micro_bench", required=True, parser_class=LazyParser,
                                 metavar="{" + ",".join(b.name for b in MICRO) + "}")
    for bench in MICRO:
        add_bench(inner, bench)


def add_bench(modes: argparse._SubParsersAction, bench: Bench) -> argparse.ArgumentParser:
    """``bench``'s subcommand; its options are read from its module on first use."""
    parser: argparse.ArgumentParser = modes.add_parser(
        bench.name, help=bench.help, module=bench.module,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser
