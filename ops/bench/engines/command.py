"""The ``kvroute bench engines`` command: its options, and which measurement runs."""

from __future__ import annotations

import argparse
import json

from ops.bench.engines.measure import ENGINE_KWARGS, bench_engine, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``kvroute bench engines`` (registered by ops/bench/cli.py)."""
    p.add_argument("--engine", nargs="+", default=["sim", "mlx"], choices=sorted(ENGINE_KWARGS))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--prompt-words", type=int, help="cold/warm prompt length (default 600; "
                   "60 with --quantize)")
    p.add_argument("--samples", type=int, help="cold/warm pairs (default 3; 1 with --quantize)")
    p.add_argument("--concurrency", type=int, help="streams at once (default 4; 2 with "
                   "--quantize)")
    p.add_argument("--max-tokens", type=int, help="per stream (default 64; 16 with --quantize)")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--quantize", type=int, nargs="+", choices=[16, 8, 4],
                   help="mlx only: the tiny model at these precisions (16 = float16), with "
                   "peak memory and KL divergence from float16 (ops.bench.engines.quantization)")
    p.add_argument("--out")


DEFAULTS = {"prompt_words": 600, "samples": 3, "concurrency": 4, "max_tokens": 64}
# CPU MLX runs quantized matmuls 7x (one token) to 70x (a 64-token prefill) slower than
# float16 ones (docs/benchmarks.md), so the quantized comparison defaults to a short workload
QUANTIZED_DEFAULTS = {"prompt_words": 60, "samples": 1, "concurrency": 2, "max_tokens": 16}


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The workload options left unset take this mode's defaults."""
    defaults = QUANTIZED_DEFAULTS if args.quantize else DEFAULTS
    return argparse.Namespace(**{**vars(args), **{k: v for k, v in defaults.items()
                                                  if getattr(args, k) is None}})


def run(args: argparse.Namespace) -> int:
    """Deploy each engine in turn, measure, print one table, write ``--out``."""
    from ops.bench.harness.stack import local_ray

    args = with_defaults(args)
    if args.quantize:
        from ops.bench.engines import quantization

        return quantization.run(args)

    with local_ray():
        results = {e: bench_engine(e, args) for e in args.engine}
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0
