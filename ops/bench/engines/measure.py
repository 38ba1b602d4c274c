"""One engine behind kvroute, measured through the router: it deploys kvroute (local Ray
on loopback, the tiny offline model or ``model_path``, memory index), then measures:
- TTFT of a cold prefix (a prompt never seen) and of a warm one (the same prompt
  again, so the replica serves it from its prefix cache), and their ratio;
- output tokens/s with ``--concurrency`` streams of ``--max-tokens`` tokens at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

ENGINE_KWARGS: dict[str, dict[str, Any]] = {
    "sim": {"tpot_s": 0.02, "prefill_tok_s": 12000.0},  # the emulator's defaults
    "mlx": {},
    "vllm": {"max_model_len": 8192},
}


def prompt_text(i: int, words: int) -> str:
    return f"document {i}: " + " ".join(f"w{(i * 31 + k) % 997}" for k in range(words))


async def _ttft(client: httpx.AsyncClient, url: str, model: str, text: str,
                max_tokens: int) -> tuple[float, int, float]:
    body = {"model": model, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": text}]}
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get(
                    "content"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first or (time.perf_counter() - start), tokens, time.perf_counter() - start


async def _measure(url: str, model: str, args: argparse.Namespace) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as c:
        cold, warm = [], []
        for i in range(args.samples):
            text = prompt_text(1000 + i, args.prompt_words)
            cold.append((await _ttft(c, url, model, text, 4))[0])
            warm.append((await _ttft(c, url, model, text, 4))[0])
        start = time.perf_counter()
        runs = await asyncio.gather(*(
            _ttft(c, url, model, prompt_text(5000 + i, 50), args.max_tokens)
            for i in range(args.concurrency)))
        wall = time.perf_counter() - start
    cold_m, warm_m = statistics.median(cold), statistics.median(warm)
    return {"ttft_cold_s": cold_m, "ttft_warm_s": warm_m, "cold_over_warm": cold_m / warm_m,
            "tokens_per_s": sum(r[1] for r in runs) / wall}


def bench_engine(engine: str, args: argparse.Namespace, model_path: Path | None = None,
                 model: str | None = None) -> dict[str, float]:
    """Deploy ``engine`` on ``model_path`` (default: the tiny model) and measure it."""
    from ops.bench.harness.config import StackSpec, build
    from ops.bench.harness.stack import deployed
    from ops.models.tiny_model import ensure_model

    model = model or f"bench-{engine}"
    path = model_path or ensure_model()
    cfg = build(StackSpec(model=model, model_path=str(path), port=args.port,
                          engine=engine, replicas=args.replicas, num_cpus=0.5,
                          context_window=8192, max_ongoing_requests=16,  # kvroute's default
                          engine_kwargs=ENGINE_KWARGS[engine]))
    t0 = time.perf_counter()
    with deployed(cfg, timeout_s=600) as url:
        startup = time.perf_counter() - t0
        return {"startup_s": startup, **asyncio.run(_measure(url, model, args))}


def table(results: dict[str, dict[str, float]]) -> str:
    """The printed table: one row per engine."""
    rows = [f"{'engine':8} {'startup s':>9} {'TTFT cold s':>11} {'TTFT warm s':>11} "
            f"{'cold/warm':>9} {'tok/s':>8}"]
    rows += [f"{e:8} {r['startup_s']:9.1f} {r['ttft_cold_s']:11.3f} {r['ttft_warm_s']:11.3f} "
             f"{r['cold_over_warm']:9.1f} {r['tokens_per_s']:8.1f}" for e, r in results.items()]
    return "\n".join(rows)
