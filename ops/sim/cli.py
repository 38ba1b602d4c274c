"""``kvroute sim``: replay a Mooncake trace through a routing policy, offline.

    kvroute sim --trace T.jsonl --replicas 8 --load 0.85 --policy kvroute --out R.json

``--speedup S`` divides arrival times by S. ``--busy RHO`` finds the speedup at which
a reference policy (``--busy-policy``, default sglang-cache-aware) keeps prefill RHO
busy (``ops.sim.calibrate``) and prints it; ``--load RHO`` picks the speedup at which
the trace's offered prefill load at its ideal reuse is RHO (``ops.sim.trace``).
``--policy`` takes one profile name or several, comma-separated (or ``all``); with
several, ``--out R.json`` writes ``R.<policy>.json`` for each. Also runnable as
``python -m ops.sim``. ``--oracle`` also prints a lower bound on any policy's TTFT
(``ops.sim.oracle``). Workers' routing stats reach the router every ``--stats-period-s``
(Serve's period), ``--stats-delay-s`` late.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from deploy.config.routing import PROFILES
from ops.sim.calibrate import REFERENCE, calibrate_speedup
from ops.sim.oracle import no_queue_ttft, summary
from ops.sim.report import bench_json, format_table, host_ratio, prefill_busy
from ops.sim.simulator import SimConfig, simulate
from ops.sim.trace import TraceRequest, ideal_reuse, load_trace, offered_load, speedup_for_load
from workers.engines.sim.core import LABEL


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim", help="offline routing-policy simulator (engine emulator, virtual time)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", required=True, help="Mooncake-format JSONL trace")
    p.add_argument("--replicas", type=int, default=8)
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--speedup", type=float, help="divide arrival times by S (default 1)")
    rate.add_argument("--load", type=float, help="speedup for this offered load (ideal reuse)")
    rate.add_argument("--busy", type=float, help="speedup keeping --busy-policy this busy")
    p.add_argument("--busy-policy", default=REFERENCE, help="reference policy of --busy")
    p.add_argument("--kv-blocks", type=int, default=1000, help="C: KV cache blocks per replica")
    p.add_argument("--host-kv-blocks", type=int, default=0,
                   help="C2: host-tier KV blocks per replica (0: no second tier)")
    p.add_argument("--host-reload-tok-s", type=float, default=120000.0,
                   help="R: host -> device reload rate of the second tier")
    p.add_argument("--block-size", type=int, default=512, help="tokens per trace hash_id")
    p.add_argument("--prefill-tok-s", type=float, default=12000.0, help="P: engine prefill rate")
    p.add_argument("--tpot-ms", type=float, default=20.0, help="decode step at batch 1")
    p.add_argument("--tpot-per-batch-ms", type=float, default=0.2, help="added per extra decode")
    p.add_argument("--policy", default="kvroute",
                   help=f"profile(s), comma-separated, or 'all': {sorted(PROFILES)}")
    p.add_argument("--prior-prefill-tok-s", type=float, default=4000.0,
                   help="router's prefill-rate prior before it learns the real one")
    p.add_argument("--tree-blocks", type=int,
                   help="cap of the baselines' approximate trees (default: each plugin's)")
    p.add_argument("--max-requests", type=int, help="replay only the first N requests")
    p.add_argument("--seed", type=int, default=0, help="seed of randomised pickers")
    p.add_argument("--stats-period-s", type=float, default=1.0,
                   help="workers' routing-stats period (Serve's; 0: fresh at every decision)")
    p.add_argument("--stats-delay-s", type=float, default=0.1,
                   help="routing stats reach the router this late (a controller tick)")
    p.add_argument("--out", help="bench JSON path")
    p.add_argument("--oracle", action="store_true",
                   help="also print the no-queueing, infinite-cache TTFT lower bound")
    p.set_defaults(func=cmd_sim)


def _policies(arg: str) -> list[str]:
    names = list(PROFILES) if arg == "all" else [n.strip() for n in arg.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise SystemExit(f"unknown policy {unknown}; known: {sorted(PROFILES)}")
    return names


def config_from_args(args: argparse.Namespace, trace: list[TraceRequest]) -> SimConfig:
    """The run's config (policy set per run); resolves --load / --busy to a speedup."""
    cfg = SimConfig(
        replicas=args.replicas, speedup=args.speedup or 1.0, kv_blocks=args.kv_blocks,
        host_kv_blocks=args.host_kv_blocks, host_reload_tok_s=args.host_reload_tok_s,
        block_size=args.block_size, prefill_tok_s=args.prefill_tok_s,
        tpot_s=args.tpot_ms / 1000.0, tpot_per_batch_s=args.tpot_per_batch_ms / 1000.0,
        seed=args.seed, prior_prefill_tok_s=args.prior_prefill_tok_s,
        tree_blocks=args.tree_blocks, stats_period_s=args.stats_period_s,
        stats_delay_s=args.stats_delay_s,
    )
    if args.load is not None:
        speedup = speedup_for_load(trace, args.load, cfg.replicas, cfg.prefill_tok_s,
                                   cfg.block_size)
    elif args.busy is not None:
        speedup = calibrate_speedup(trace, cfg, args.busy, args.busy_policy)
        sys.stderr.write(f"speedup {speedup} keeps {args.busy_policy} {args.busy:.0%} busy\n")
    else:
        return cfg
    return dataclasses.replace(cfg, speedup=speedup)


def run_one(trace: list[TraceRequest], cfg: SimConfig, trace_path: str) -> dict[str, Any]:
    """Simulate one policy and return its bench JSON."""
    result = simulate(trace, cfg)
    params: dict[str, Any] = {
        "engine": LABEL, "time": "virtual", "trace": trace_path,
        **{k: v for k, v in dataclasses.asdict(cfg).items() if k != "policy"},
        "ideal_reuse": ideal_reuse(trace, cfg.block_size),
        "offered_load": offered_load(trace, cfg.speedup, cfg.replicas, cfg.prefill_tok_s,
                                     cfg.block_size),
        "prefill_busy": prefill_busy(result),
        "host_cached_token_ratio": host_ratio(result),
    }
    return bench_json(result, Path(trace_path).stem, params)


def _out_path(out: str, policy: str, several: bool) -> Path:
    path = Path(out)
    return path.with_name(f"{path.stem}.{policy}{path.suffix}") if several else path


def cmd_sim(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace, args.max_requests)
    if not trace:
        raise SystemExit(f"no requests in {args.trace}")
    policies = _policies(args.policy)
    base = config_from_args(args, trace)
    benches = []
    for policy in policies:
        started = time.perf_counter()
        bench = run_one(trace, dataclasses.replace(base, policy=policy), args.trace)
        benches.append(bench)
        wall = time.perf_counter() - started
        sys.stderr.write(f"[{LABEL}] {policy}: {bench['requests']} requests in {wall:.1f} s\n")
        if args.out:
            path = _out_path(args.out, policy, len(policies) > 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(bench, indent=2) + "\n", encoding="utf-8")
    sys.stdout.write(format_table(benches) + "\n")
    if args.oracle:
        low = summary(no_queue_ttft(trace, base.block_size, base.prefill_tok_s))
        sys.stdout.write("oracle (no queueing, infinite cache): " + " ".join(
            f"ttft_{k} {v:.3f}" for k, v in low.items()) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvroute")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
