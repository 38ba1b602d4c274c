"""``kvroute bench engines --engine mlx --quantize 16 8 4``: one model at float16 and
quantized to 8 and 4 bits (``ops.models.quantize``: mlx-lm's converter), side by side.

For each precision:
- through kvroute (the tiny model on mlx replicas, as ``bench engines`` measures any
  engine): TTFT of a cold and of a warm prefix, output tokens/s at ``--concurrency``;
- on the engine alone, in a fresh process each so their peaks do not mix: the weights'
  bytes, mlx's peak memory over loading the model, one prefill of the cold prompt and
  ``--max-tokens`` of decode (``mx.get_peak_memory``), and that prefill's and decode's rates;
- fidelity to float16: the mean KL divergence of the next-token distribution from
  float16's, KL(P_fp16 || P_q) in nats, over every position of fixed windows of the tiny
  model's own corpus (``ops/models/tiny_corpus.txt``), and how often the two agree on the
  most likely token. The weights are random, so task accuracy would mean nothing; the
  divergence measures what quantization changes in the output distribution all the same.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WINDOWS, WINDOW_TOKENS = 4, 64  # 256 scored positions (CPU MLX's quantized matmul is slow)


def corpus_windows(tokenizer: Any, n: int = WINDOWS, length: int = WINDOW_TOKENS
                   ) -> list[list[int]]:
    """``n`` consecutive windows of ``length`` token ids from the tiny model's corpus."""
    from ops.models.tiny_model import CORPUS_PATH

    text = CORPUS_PATH.read_text()
    ids = tokenizer.encode(text)
    while len(ids) < n * length:  # the corpus is read again from its start if short
        ids = ids + ids
    return [ids[i * length:(i + 1) * length] for i in range(n)]


def _log_probs(model: Any, window: list[int]) -> Any:
    import mlx.core as mx

    logits = model(mx.array([window]))[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def fidelity(reference: Path, other: Path, windows: int = WINDOWS,
             length: int = WINDOW_TOKENS) -> dict[str, float]:
    """KL(P_reference || P_other) per position (mean, p99, nats) and top-1 agreement."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load

    ref_model, tokenizer = load(str(reference))
    other_model, _ = load(str(other))
    kls, agree = [], []
    for window in corpus_windows(tokenizer, windows, length):
        p, q = _log_probs(ref_model, window), _log_probs(other_model, window)
        kl = mx.sum(mx.exp(p) * (p - q), axis=-1)
        same = mx.argmax(p, axis=-1) == mx.argmax(q, axis=-1)
        kls.append(np.array(kl))
        agree.append(np.array(same))
    kl_all, agree_all = np.concatenate(kls), np.concatenate(agree)
    return {"kl_mean": float(kl_all.mean()), "kl_p99": float(np.quantile(kl_all, 0.99)),
            "top1_agreement": float(agree_all.mean()), "positions": int(kl_all.size)}


def profile(path: Path, prompt: str, max_tokens: int) -> dict[str, float]:
    """The engine alone in this process: weights' bytes, mlx's peak memory, prefill and
    decode rates (mlx-lm's own ``stream_generate`` figures), time to the first token."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load, stream_generate

    mx.reset_peak_memory()
    model, tokenizer = load(str(path))
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    start, first = time.perf_counter(), None
    for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        first = first or time.perf_counter() - start
        last = response
    assert first is not None
    return {"weights_bytes": weights, "peak_memory_bytes": mx.get_peak_memory(),
            "ttft_s": first, "prefill_tok_s": last.prompt_tps,
            "decode_tok_s": last.generation_tps, "prompt_tokens": last.prompt_tokens}


def _profile_apart(path: Path, prompt: str, max_tokens: int) -> dict[str, float]:
    """``profile`` in a fresh interpreter: one model's peak is not another's."""
    out = subprocess.run(
        [sys.executable, "-m", "ops.bench.engines.quantization", str(path), str(max_tokens)],
        input=prompt, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    """Convert (cached), measure each precision, print one table, write ``--out``."""
    from ops.bench.engines import measure
    from ops.bench.harness.stack import local_ray
    from ops.models.quantize import ensure_variant, label

    if args.engine != ["mlx"]:
        raise SystemExit("bench engines --quantize runs on --engine mlx (mlx-lm's quantization)")
    bits = sorted(set(args.quantize), reverse=True)
    paths = {label(b): ensure_variant(b) for b in [16, *bits]}
    prompt = measure.prompt_text(1000, args.prompt_words)
    results: dict[str, dict[str, Any]] = {}
    with local_ray():
        for b in bits:
            name = label(b)
            served = measure.bench_engine("mlx", args, model_path=paths[name],
                                          model=f"bench-mlx-{name}")
            results[name] = {"bits": b, "path": str(paths[name]), **served,
                             "engine_alone": _profile_apart(paths[name], prompt,
                                                            args.max_tokens),
                             "fidelity": fidelity(paths["fp16"], paths[name])}
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps({"engine": "mlx", "replicas": args.replicas,
                                              "variants": results}, indent=2))
    return 0


def table(results: dict[str, dict[str, Any]]) -> str:
    """One row per precision."""
    rows = [f"{'model':6} {'weights MB':>10} {'peak MB':>8} {'TTFT cold s':>11} "
            f"{'TTFT warm s':>11} {'tok/s':>7} {'decode tok/s':>12} {'KL mean':>9} "
            f"{'top-1':>6}"]
    for name, r in results.items():
        alone, fid = r["engine_alone"], r["fidelity"]
        rows.append(f"{name:6} {alone['weights_bytes'] / 1e6:10.2f} "
                    f"{alone['peak_memory_bytes'] / 1e6:8.1f} {r['ttft_cold_s']:11.3f} "
                    f"{r['ttft_warm_s']:11.3f} {r['tokens_per_s']:7.1f} "
                    f"{alone['decode_tok_s']:12.1f} {fid['kl_mean']:9.2e} "
                    f"{fid['top1_agreement']:6.3f}")
    return "\n".join(rows)


if __name__ == "__main__":  # _profile_apart's child: PATH MAX_TOKENS, the prompt on stdin
    print(json.dumps(profile(Path(sys.argv[1]), sys.stdin.read(), int(sys.argv[2]))))
