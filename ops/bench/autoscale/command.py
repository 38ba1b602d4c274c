"""``kvroute bench autoscale``'s options and command (the run: ``ops.bench.autoscale.bench``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ops.bench.autoscale import bench as autoscale
from ops.bench.harness import report
from ops.bench.harness.args import command_line
from ops.bench.harness.workloads import override_params


def add_arguments(a: argparse.ArgumentParser) -> None:
    d = autoscale.AutoscaleSpec()
    a.add_argument("--engine", choices=["sim"], default="sim")
    a.add_argument("--policy", default=d.policy, help="kvroute or serve-default; a comma "
                   "list runs each in turn on one cluster (--out F writes F-<run>.json)")
    a.add_argument("--duration", type=float, default=d.duration_s, help="seconds of load")
    a.add_argument("--trace", default=d.trace, help="the Azure LLM inference trace CSV")
    a.add_argument("--trace-start", type=float, default=d.trace_start_s,
                   help="skip the trace's first S seconds")
    a.add_argument("--speedup", type=float, default=d.speedup, help="trace seconds / S")
    a.add_argument("--sample", type=float, default=d.sample, help="share of arrivals sent")
    a.add_argument("--sessions", type=int, default=d.sessions, help="agent sessions at once")
    a.add_argument("--ttft-target", type=float, default=d.ttft_target_s,
                   help="the TTFT every run is scored on (within target), and the kvroute "
                   "policy's objective unless --policy-ttft is given")
    a.add_argument("--policy-ttft", help="kvroute policy: its ttft_target_s when it should "
                   "differ from --ttft-target (a comma list: one run each, labelled kvroute@Ns)")
    a.add_argument("--min-replicas", type=int, default=d.min_replicas)
    a.add_argument("--max-replicas", type=int, default=d.max_replicas)
    a.add_argument("--target-ongoing", default=f"{d.target_ongoing_requests:g}",
                   help="serve-default: ongoing requests per replica it aims for (a comma "
                   "list: one run each)")
    a.add_argument("--upscale-delay", type=float, default=d.upscale_delay_s)
    a.add_argument("--downscale-delay", type=float, default=d.downscale_delay_s)
    a.add_argument("--prefill-tok-s", type=float, default=d.sim["prefill_tok_s"],
                   help="the emulated prefill rate of each replica: set it low (e.g. 400) "
                   "with short replies (--agent reply_tokens=16) for a sleep-bound run, where "
                   "a replica's capacity is emulated time, not the machine's CPU")
    a.add_argument("--tpot-ms", type=float, default=1000 * d.sim["tpot_s"],
                   help="the emulated decode step at batch 1 (ms)")
    a.add_argument("--startup", type=float, default=d.startup_s,
                   help="kvroute policy: a new replica's start-up time until one is measured")
    a.add_argument("--seed", type=int, default=d.seed)
    a.add_argument("--prewarm", default="on", help="router.routing.prewarm for new replicas: on, "
                   "off, or on,off (each policy run once with and once without)")
    a.add_argument("--agent", action="append", default=[], metavar="KEY=VALUE",
                   help="override an AgentParams field (ops.bench.harness.workloads), repeatable")
    a.add_argument("--out", type=Path, help="write the JSON here")
    a.add_argument("--plot", type=Path, help="write the replicas/TTFT-over-time PNG here")
    a.add_argument("--with", dest="others", type=Path, nargs="*", default=[],
                   help="earlier runs' JSON drawn beside this one in --plot and --markdown")
    a.add_argument("--markdown", type=Path, help="write the runs' table here")
    a.add_argument("--quiet", action="store_true")


def specs(args: argparse.Namespace) -> list[autoscale.AutoscaleSpec]:
    """One run per policy, per its own knob's value (serve-default's target, kvroute's
    objective) and per ``--prewarm`` setting."""
    d = autoscale.AutoscaleSpec()
    base = replace(
        d, duration_s=args.duration, trace=args.trace, trace_start_s=args.trace_start,
        speedup=args.speedup, sample=args.sample, sessions=args.sessions,
        ttft_target_s=args.ttft_target, min_replicas=args.min_replicas,
        max_replicas=args.max_replicas, upscale_delay_s=args.upscale_delay,
        downscale_delay_s=args.downscale_delay, seed=args.seed, startup_s=args.startup,
        agent=override_params(d.agent, args.seed, args.agent),
        sim={**d.sim, "prefill_tok_s": args.prefill_tok_s, "tpot_s": args.tpot_ms / 1000})
    warm = {"on": True, "off": False}
    if bad := set(args.prewarm.split(",")) - set(warm):
        raise SystemExit(f"--prewarm: unknown {sorted(bad)}")
    # one run per serve-default target and per kvroute objective (their own knobs)
    knobs = {"serve-default": [("target_ongoing_requests", float(t))
                               for t in args.target_ongoing.split(",")],
             "kvroute": [("policy_ttft_s", float(t) if t else None)
                         for t in (args.policy_ttft or "").split(",")]}
    if bad := set(args.policy.split(",")) - set(knobs):
        raise SystemExit(f"--policy: unknown {sorted(bad)}")
    return [replace(base, policy=p, prewarm=warm[w], **dict([k]))
            for p in args.policy.split(",") for k in knobs[p]
            for w in args.prewarm.split(",")]


def run(args: argparse.Namespace) -> int:
    specs_ = specs(args)
    command = command_line("autoscale")

    def write(bench: dict[str, Any]) -> None:  # as each run ends
        bench["command"] = command
        report.validate(bench)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            path = args.out if len(specs_) == 1 else \
                args.out.with_name(f"{args.out.stem}-{bench['policy']}{args.out.suffix}")
            path.write_text(json.dumps(bench, indent=2) + "\n")

    benches = autoscale.run_autoscale(specs_, show=not args.quiet, on_run=write)
    runs = {b["policy"]: b for b in benches}
    _print_runs(runs)
    for other in args.others:
        b = json.loads(other.read_text())
        runs.setdefault(b["policy"], b)
    if args.plot:
        report.plot_autoscale(runs, args.plot)
    if args.markdown:
        args.markdown.write_text(report.markdown_autoscale(runs))
    return 0


def _print_runs(runs: dict[str, dict[str, Any]]) -> None:
    print(report.markdown_autoscale(runs))
    for name, b in runs.items():
        print(f"{name}: replica-seconds {b['replica_seconds']:.0f}  SLO attainment "
              f"{100 * b['slo_attainment']:.1f}% (TTFT <= {b['ttft_target_s']:g} s)  peak "
              f"{b['peak_replicas']} replicas  machine CPU busy {100 * b['cpu_busy_mean']:.0f}% "
              f"(p90 {100 * b['cpu_busy_p90']:.0f}%)  scale-downs lost "
              f"{b['scale_down_lost_blocks']} cached blocks (stopping the least-used: "
              f"{b['scale_down_least_lost_blocks']})")
