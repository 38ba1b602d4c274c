"""What constrained decoding costs, on the tiny model's tokenizer and (``--engine``) on the
mlx engine itself:

1. per grammar library installed (llguidance, xgrammar, outlines-core): the tokenizer's
   one-time setup, a nested JSON schema's compile time, and the time to compute one
   token's mask along a random walk through the grammar (``STEPS`` steps);
2. ``--engine``: the mlx engine's time per generated token (wall time over tokens, the
   sequences of a round together), free text against the same prompt under a JSON schema
   and under ``json_object``, ``--batch`` sequences at once (``workers.engines.mlx.grammar``).

    kvroute bench micro grammar-cost [--engine] [--tokens N] [--batch B]
    .venv-vllm/bin/python -m ops.bench micro grammar-cost     (xgrammar and outlines-core
                                                              live in the vLLM venv)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 200
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "tags", "addr", "kind"], "properties": {
              "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
              "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
              "addr": {"type": "object", "required": ["city", "zip"], "properties": {
                  "city": {"type": "string"}, "zip": {"type": "string",
                                                      "pattern": "[0-9]{5}"}}},
              "kind": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]}}}
Walk = tuple[Callable[[], np.ndarray], Callable[[int], bool]]  # (allowed ids, consume)


def _hf(model_dir: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    return PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"),
                                   eos_token=cfg.get("eos_token"))


def _bits(mask: np.ndarray, vocab: int) -> np.ndarray:
    return np.nonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab])[0]


def _llguidance(hf: Any) -> tuple[float, Callable[[], Walk]]:
    import llguidance as llg
    import llguidance.numpy as lnp

    t0 = time.perf_counter()
    tok = llg.LLTokenizer(hf.backend_tokenizer.to_str(), n_vocab=len(hf),
                          eos_token=hf.eos_token_id)
    setup = time.perf_counter() - t0

    def compile_() -> Walk:
        m = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
        bm = lnp.allocate_token_bitmask(1, len(hf))

        def allowed() -> np.ndarray:
            lnp.fill_next_token_bitmask(m, bm)
            return bm[0]
        return allowed, lambda t: bool(m.consume_token(t)) and not m.is_stopped()
    return setup, compile_


def _xgrammar(hf: Any) -> tuple[float, Callable[[], Walk]]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    setup = time.perf_counter() - t0

    def compile_() -> Walk:
        comp = xgr.GrammarCompiler(info, cache_enabled=False)
        m = xgr.GrammarMatcher(comp.compile_json_schema(json.dumps(SCHEMA)))
        bm = xgr.allocate_token_bitmask(1, info.vocab_size)

        def allowed() -> np.ndarray:
            m.fill_next_token_bitmask(bm)
            return bm[0].numpy()  # type: ignore[no-any-return]
        return allowed, lambda t: bool(m.accept_token(t)) and not m.is_terminated()
    return setup, compile_


def _byte_vocab(hf: Any) -> dict[bytes, list[int]]:
    """GPT-2 byte-level token strings → their bytes (what outlines-core's vocabulary takes)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs, strict=True)}
    out: dict[bytes, list[int]] = {}
    for text, i in hf.get_vocab().items():
        if i not in hf.all_special_ids:
            raw = bytes(dec[c] for c in text) if all(c in dec for c in text) else text.encode()
            out.setdefault(raw, []).append(i)
    return out


def _outlines(hf: Any) -> tuple[float, Callable[[], Walk]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    vocab = Vocabulary(hf.eos_token_id, _byte_vocab(hf))
    setup = time.perf_counter() - t0

    def compile_() -> Walk:
        g = Guide(Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab))

        def consume(t: int) -> bool:
            g.advance(t)
            return not g.is_finished()
        return lambda: np.asarray(g.get_tokens()), consume
    return setup, compile_


LIBS = {"llguidance": ("llguidance", _llguidance), "xgrammar": ("xgrammar", _xgrammar),
        "outlines-core": ("outlines_core", _outlines)}


def library_costs(model_dir: Path, name: str) -> dict[str, float]:
    """Setup s, compile ms (median of 5), mask µs (mean, p50) along a random walk."""
    hf = _hf(model_dir)
    setup, compile_ = LIBS[name][1](hf)
    compiles = []
    for _ in range(5):
        t0 = time.perf_counter()
        allowed, consume = compile_()
        compiles.append(time.perf_counter() - t0)
    rng, times = np.random.default_rng(0), []
    is_bits = name != "outlines-core"
    for _ in range(STEPS):
        t0 = time.perf_counter()
        mask = allowed()
        times.append(time.perf_counter() - t0)
        ids = _bits(mask, len(hf)) if is_bits else mask
        if not len(ids) or not consume(int(rng.choice(ids))):
            break
    return {"setup_s": setup, "compile_ms": 1e3 * statistics.median(compiles),
            "mask_us_mean": 1e6 * statistics.fmean(times),
            "mask_us_p50": 1e6 * statistics.median(times), "steps": len(times)}


def processor_cost(model_dir: Path) -> dict[str, float]:
    """The mlx engine's per-token work for one constrained sequence
    (``GrammarProcessor.__call__``: feed the sampled token, compute the mask, apply it to
    the logits), in this thread's CPU µs (what the engine thread spends; unlike wall time,
    other work on the machine hardly moves it), along a walk of allowed tokens."""
    import mlx.core as mx

    from workers.engines.mlx.grammar import Grammars
    from workers.protocol import Constraint

    hf = _hf(model_dir)
    grammars = Grammars(hf, [hf.eos_token_id])
    proc = grammars.processor(Constraint("json", json.dumps(SCHEMA)))
    rng, tokens, cpu = np.random.default_rng(0), [1, 2, 3], []
    logits = mx.array(rng.standard_normal((1, grammars.vocab)).astype(np.float32))
    for _ in range(STEPS):
        t0 = time.thread_time()
        out = proc(mx.array(tokens), logits)
        mx.eval(out)
        cpu.append(time.thread_time() - t0)
        ok = np.nonzero(np.isfinite(np.array(out[0])))[0]
        if not len(ok) or int(ok[0]) == hf.eos_token_id:
            break
        tokens.append(int(rng.choice(ok)))
    return {"cpu_us_mean": 1e6 * statistics.fmean(cpu), "cpu_us_p50": 1e6 * statistics.median(cpu),
            "steps": len(cpu)}


async def _decode(model_dir: Path, tokens: int, batch: int, rounds: int
                  ) -> dict[str, tuple[float, int]]:
    """mlx decode ms per token, free / under a schema / under json_object: the cases
    alternate for ``rounds`` rounds after a warm-up one, and each keeps its fastest round
    (the least disturbed by other work on the machine). Also the tokens it generated."""
    from workers.engines.mlx.engine import MlxEngine
    from workers.protocol import Constraint, Finished, GenerateRequest, SamplingParams

    engine = MlxEngine(str(model_dir), "bench/grammar", "r0", 16)
    await engine.start()

    async def one(rid: str, c: Constraint | None) -> int:
        sp = SamplingParams(max_tokens=tokens, ignore_eos=True, constraint=c)
        async for item in engine.generate(GenerateRequest(rid, [5, 17, 99, 240], sp)):
            if isinstance(item, Finished):
                return item.usage.completion_tokens
        return 0
    cases = {"free": None, "json_schema": Constraint("json", json.dumps(SCHEMA)),
             "json_object": Constraint("json_object")}
    best: dict[str, tuple[float, int]] = {}
    try:
        for rnd in range(rounds + 1):  # round 0 warms up (and builds the grammar tokenizer)
            for label, c in cases.items():
                t0 = time.perf_counter()
                n = sum(await asyncio.gather(*(one(f"{label}{rnd}-{i}", c)
                                               for i in range(batch))))
                ms = 1e3 * (time.perf_counter() - t0) / max(n, 1)
                if rnd and (label not in best or ms < best[label][0]):
                    best[label] = (ms, n)
    finally:
        await engine.shutdown()
    return best


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a model folder (default: the tiny model)")
    p.add_argument("--engine", action="store_true", help="also time the mlx engine's decode")
    p.add_argument("--tokens", type=int, default=128, help="tokens per sequence (--engine)")
    p.add_argument("--batch", type=int, default=1, help="sequences at once (--engine)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (--engine)")


def run(args: argparse.Namespace) -> int:
    from ops.models.tiny_model import ensure_model

    model_dir = Path(args.model) if args.model else ensure_model()
    print("| library | tokenizer setup s | JSON schema compile ms | mask µs mean | "
          "mask µs p50 | walk steps |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (module, _) in LIBS.items():
        if importlib.util.find_spec(module) is None:
            print(f"| {name} | not installed | | | | |")
            continue
        c = library_costs(model_dir, name)
        print(f"| {name} | {c['setup_s']:.3f} | {c['compile_ms']:.1f} | "
              f"{c['mask_us_mean']:.0f} | {c['mask_us_p50']:.0f} | {c['steps']:.0f} |",
              flush=True)
    if importlib.util.find_spec("mlx") is not None:
        p = processor_cost(model_dir)
        print(f"\nmlx GrammarProcessor, per token: {p['cpu_us_mean']:.0f} µs CPU mean, "
              f"{p['cpu_us_p50']:.0f} µs p50 ({p['steps']:.0f} steps)")
    if args.engine:
        d = asyncio.run(_decode(model_dir, args.tokens, args.batch, args.rounds))
        print(f"\nmlx decode, batch {args.batch}, up to {args.tokens} tokens a sequence "
              f"(fastest of {args.rounds} rounds):")
        for label, (ms, n) in d.items():
            print(f"  {label}: {ms:.2f} ms per token ({n} tokens, "
                  f"{ms / d['free'][0] - 1:+.0%} vs free)")
    return 0
