"""``kvroute bench calibrate``: the sim engine emulator fitted to a real engine, and the
error the fitted emulator still makes.

    kvroute bench calibrate --engine mlx --out calibrate-mlx.json \\
        --profile-out workers/engines/sim/profiles/mlx-tiny.json

On one local Ray, one replica at a time behind kvroute (stream pacing 0, the tiny model):

1. the real engine: the curves (``ops.bench.calibrate.measure``), then the replays
   (``ops.bench.calibrate.replay``: short agent sessions, a shrunk Mooncake slice);
2. an emulator with no costs (P = 10^9 tok/s, TPOT 0): the stack's own TTFT, which the
   real engine's intercept includes and the emulator pays anyway;
3. the emulator with the fitted constants (``ops.bench.calibrate.fit``), same KV budget in
   64-token blocks as the real engine's bytes hold: the same curves and replays.

The JSON: ``engine``, ``fitted`` (the emulator's constants), ``error`` (per-request TTFT
error median and p90, hit-rate difference, over both replays; ``by_workload`` each), the
``curves`` of both, the fit lines' residuals, the load average. ``--profile-out`` writes
the profile the emulator loads with ``engine_kwargs.profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ops.bench.calibrate.measure import CurveSpec, Point

MODEL = "bench-model"
_TRACE_NAME = Path("shared") / "traces" / "mooncake_trace_1000.jsonl"
# ../shared from the project root (a git worktree's root may sit one level deeper)
TRACE = next((d / _TRACE_NAME for d in Path(__file__).resolve().parents[3:6]
              if (d / _TRACE_NAME).is_file()), None)
STACK_SIM = {"prefill_tok_s": 1e9, "tpot_s": 0.0, "tpot_per_batch_s": 0.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["mlx", "vllm"], default="mlx")
    p.add_argument("--model-path", help="model folder (default: the tiny offline model)")
    p.add_argument("--lengths", default="16,64,128,256", help="cold prompt lengths")
    p.add_argument("--cached", default="128,256", help="cached prefix lengths")
    p.add_argument("--batches", default="1,2,4,8", help="decode batch sizes")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--trace", default=str(TRACE) if TRACE else None,
                   help="Mooncake JSONL for the replay (default: ../shared/traces/...)")
    p.add_argument("--trace-requests", type=int, default=20)
    p.add_argument("--agent-sessions", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=0,
                   help="emulator KV blocks (0: what the real engine's KV budget holds)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--profile-out", type=Path, help="write the emulator's profile here")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def curve_spec(args: argparse.Namespace) -> CurveSpec:
    return CurveSpec(lengths=_ints(args.lengths), cached=_ints(args.cached),
                     batches=_ints(args.batches), samples=args.samples)


def run(args: argparse.Namespace) -> int:
    from ops.bench.calibrate.replay import ReplaySpec
    from ops.bench.harness.args import command_line
    from ops.bench.harness.report import json_text
    from ops.bench.harness.stack import with_fresh_ray
    from ops.models.tiny_model import ensure_model

    model_path = args.model_path or str(ensure_model())
    replay = ReplaySpec(trace=args.trace, trace_requests=args.trace_requests,
                        agent_sessions=args.agent_sessions)
    result = with_fresh_ray(lambda: calibrate(args.engine, model_path, curve_spec(args),
                                              replay, args.kv_blocks))
    result["command"] = command_line("calibrate")
    print(summary(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json_text(result) + "\n")
    if args.profile_out:
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        args.profile_out.write_text(json_text(profile(result)) + "\n")
    e = result["error"]
    return 0 if e["real_errors"] == 0 and e["sim_errors"] == 0 and e["requests"] else 1


def calibrate(engine: str, model_path: str, curves: CurveSpec, replay: Any,
              kv_blocks: int = 0, port: int = 0) -> dict[str, Any]:
    """On the running Ray: the three phases of the module docstring; the result JSON."""
    from ops.bench.calibrate import fit, measure
    from ops.bench.calibrate import replay as rp

    load_start = os.getloadavg()
    with _deployed(engine, model_path, _real_kwargs(engine), port) as url:
        real_curves = asyncio.run(measure.curves(url, MODEL, curves, "real"))
        real_runs = asyncio.run(rp.replay(url, MODEL, replay, "calib"))
    with _deployed("sim", model_path, dict(STACK_SIM), port) as url:
        stack_s = asyncio.run(measure.overhead_s(url, MODEL))
    fitted, lines = fit.fit(real_curves, stack_s)
    blocks = kv_blocks or _kv_blocks(engine)
    sim_kwargs = {**fitted, "kv_blocks": blocks}
    with _deployed("sim", model_path, sim_kwargs, port) as url:
        sim_curves = asyncio.run(measure.curves(url, MODEL, curves, "real"))
        sim_runs = asyncio.run(rp.replay(url, MODEL, replay, "calib"))
    by = {w: rp.error(real_runs[w], sim_runs.get(w, [])) for w in real_runs}
    return {
        "engine": engine, "model_path": model_path, "fitted": fitted,
        "error": rp.combined(by, real_runs, sim_runs), "sim_kv_blocks": blocks,
        "stack_ttft_s": stack_s, "fit_lines": {k: asdict(v) for k, v in lines.items()},
        "curves": {"real": _plain(real_curves), "sim": _plain(sim_curves)},
        "params": {"curves": asdict(curves), "replay": rp.params(replay)},
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
    }


def _real_kwargs(engine: str) -> dict[str, Any]:
    from ops.bench.overhead.targets import EngineSettings

    return EngineSettings(engine, "").engine_kwargs()


def _kv_blocks(engine: str) -> int:
    """64-token blocks the real engine's KV budget holds (the tiny model: 4 KiB a token)."""
    from ops.bench.overhead.targets import EngineSettings

    s = EngineSettings(engine, "")
    budget = s.cache_bytes if engine == "mlx" else s.kv_cache_bytes
    return max(1, budget // (4096 * 64))


def _deployed(engine: str, model_path: str, kwargs: dict[str, Any], port: int) -> Any:
    from ops.bench.harness.config import StackSpec, build
    from ops.bench.harness.procs import free_port
    from ops.bench.harness.stack import deployed

    spec = StackSpec(model=MODEL, model_path=model_path, port=port or free_port(),
                     engine=engine, replicas=1, num_cpus=0.5, engine_kwargs=kwargs,
                     context_window=8192, max_ongoing_requests=64, stream_interval_ms=0.0)
    return deployed(build(spec), timeout_s=900.0)


def _plain(curves: dict[str, list[Point]]) -> dict[str, list[dict[str, float]]]:
    return {k: [asdict(p) for p in v] for k, v in curves.items()}


def profile(result: dict[str, Any]) -> dict[str, Any]:
    """What ``engine_kwargs.profile`` loads (``workers.engines.sim.profile``)."""
    e = result["error"]
    return {"engine": result["engine"], "model": Path(result["model_path"]).name,
            "fitted": result["fitted"],
            "error": {k: e[k] for k in ("ttft_rel_median", "ttft_rel_p90", "hit_rate_diff")},
            "command": result.get("command", ""), "load_avg": result["load_avg"]}


def summary(result: dict[str, Any]) -> str:
    f, e = result["fitted"], result["error"]
    lines = [f"{result['engine']}: fitted " + ", ".join(f"{k} {v:.4g}" for k, v in f.items()),
             f"TTFT error over {e['requests']} requests: median {100 * e['ttft_rel_median']:.1f}%"
             f", p90 {100 * e['ttft_rel_p90']:.1f}%; hit rate real {100 * e['real_hit_rate']:.1f}%"
             f" sim {100 * e['sim_hit_rate']:.1f}% (diff {100 * e['hit_rate_diff']:+.1f} points)"]
    for w, by in e["by_workload"].items():
        lines.append(f"  {w}: median {100 * by['ttft_rel_median']:.1f}%, p90 "
                     f"{100 * by['ttft_rel_p90']:.1f}%, hit diff {100 * by['hit_rate_diff']:+.1f}")
    return "\n".join(lines)
