"""What logprobs cost the mlx engine, in process: ``--streams`` concurrent greedy requests
of ``--tokens`` tokens each on one ``MlxEngine`` (the tiny model unless ``--model``),
without logprobs and with ``top_logprobs`` 0, 5 and 20 (each round runs every setting, so a
loaded machine's drift spreads over all of them). Decode tokens/s, and the process CPU per
token: the figure a loaded machine disturbs least (the work itself, not the wait for a
core). Then prompt logprobs: a ``--prompt``-token prompt prefilled with ``prompt_logprobs``
5 against the same prompt without (no cached prefix either way): its time to the first
token and CPU.

    kvroute bench micro logprobs-cost [--rounds 3] [--streams 8] [--tokens 64] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from workers.protocol import Finished, GenerateRequest, SamplingParams

SETTINGS: tuple[int | None, ...] = (None, 0, 5, 20)
_ids = itertools.count()


def _prompt(n: int, base: int) -> list[int]:
    return [5 + (base * 131 + i * 17) % 4000 for i in range(n)]


async def _one(engine: object, prompt: list[int], sp: SamplingParams) -> tuple[int, float]:
    """(tokens generated, seconds to the first)."""
    started, first, n = time.perf_counter(), 0.0, 0
    async for item in engine.generate(  # type: ignore[attr-defined]
            GenerateRequest(f"lp-{next(_ids)}", prompt, sp)):
        if isinstance(item, Finished):
            return item.usage.completion_tokens, first
        if not first:
            first = time.perf_counter() - started
        n += len(item.token_ids)
    return n, first


async def _decode(engine: object, top: int | None, streams: int, tokens: int, r: int
                  ) -> tuple[float, float]:
    """(tokens/s, process CPU ms per token) of ``streams`` concurrent requests."""
    sp = SamplingParams(max_tokens=tokens, ignore_eos=True, logprobs=top)
    base = r * 1000 + SETTINGS.index(top) * 100  # prompts of its own: no run finds them cached
    started, cpu = time.perf_counter(), time.process_time()
    done = await asyncio.gather(*(_one(engine, _prompt(32, base + i), sp)
                                  for i in range(streams)))
    n = sum(k for k, _ in done)
    return n / (time.perf_counter() - started), 1e3 * (time.process_time() - cpu) / n


async def _prefill(engine: object, prompt_logprobs: int | None, length: int, r: int
                   ) -> tuple[float, float]:
    """(TTFT s, process CPU s) of one prompt of its own: no cached prefix helps either run."""
    sp = SamplingParams(max_tokens=1, ignore_eos=True, prompt_logprobs=prompt_logprobs)
    cpu = time.process_time()
    ttft = (await _one(engine, _prompt(length, 7000 + r * 2 + (prompt_logprobs is None)),
                       sp))[1]
    return ttft, time.process_time() - cpu


async def _run(args: argparse.Namespace, model: str) -> None:
    from workers.engines.mlx.engine import MlxEngine

    engine = MlxEngine(model, "bench/tiny", "r0", 16, cache_bytes=1 << 30)
    await engine.start()
    try:
        await _decode(engine, None, args.streams, 8, 0)  # warm-up
        runs: dict[int | None, list[tuple[float, float]]] = {s: [] for s in SETTINGS}
        print("| round | top_logprobs | tokens/s | CPU ms/token |\n|---:|---:|---:|---:|")
        for r in range(args.rounds):
            for top in SETTINGS:
                runs[top].append(await _decode(engine, top, args.streams, args.tokens, r + 1))
                rate, cpu = runs[top][-1]
                print(f"| {r + 1} | {_label(top)} | {rate:.0f} | {cpu:.2f} |", flush=True)
        print("\n| top_logprobs | median tokens/s | median CPU ms/token | CPU vs off |\n"
              "|---:|---:|---:|---:|")
        off = statistics.median(c for _, c in runs[None])
        for top in SETTINGS:
            rate, cpu = (statistics.median(v) for v in zip(*runs[top], strict=True))
            print(f"| {_label(top)} | {rate:.0f} | {cpu:.2f} | {cpu / off:.2f} |")
        pre: dict[int | None, list[tuple[float, float]]] = {None: [], 5: []}
        for r in range(args.rounds):
            for plp in pre:
                pre[plp].append(await _prefill(engine, plp, args.prompt, r))
        print(f"\n| {args.prompt}-token prompt | median TTFT ms | median CPU ms |\n"
              "|---|---:|---:|")
        for plp, label in ((None, "plain prefill"), (5, "prompt_logprobs 5")):
            ttft, cpu = (statistics.median(v) for v in zip(*pre[plp], strict=True))
            print(f"| {label} | {1e3 * ttft:.0f} | {1e3 * cpu:.0f} |")
    finally:
        await engine.shutdown()


def _label(top: int | None) -> str:
    return "off" if top is None else str(top)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=8, help="concurrent requests")
    p.add_argument("--tokens", type=int, default=64, help="tokens per request")
    p.add_argument("--prompt", type=int, default=512, help="prompt-logprobs prompt length")
    p.add_argument("--model", help="an mlx model folder (default: the tiny model)")


def run(args: argparse.Namespace) -> int:
    model = args.model
    if model is None:
        from ops.models.tiny_model import ensure_model

        model = str(ensure_model(Path(tempfile.gettempdir()) / "kvroute-bench-model"))
    asyncio.run(_run(args, model))
    return 0
