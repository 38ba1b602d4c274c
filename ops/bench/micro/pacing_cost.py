"""What stream pacing costs a worker, in process: 16 concurrent engine streams of
``TOKENS`` tokens 10 ms apart (the agent bench's sim), each read through
``workers.transport.stream_pacing.paced`` at 0 (no layer, the default) and at 20 ms.
Process CPU µs per token, the engine's own sleeps included, and the chunks per stream.

    kvroute bench micro pacing-cost [--impl PATH] [--rounds N]

``--impl`` measures another ``stream_pacing`` module, e.g. an older one:
``git show ea72c01:workers/transport/stream_pacing.py > /tmp/old.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ops.bench.harness.micro import timing
from workers.protocol import Finished, TokenChunk, Usage
from workers.transport import stream_pacing

STREAMS, TOKENS, GAP_S = 16, 300, 0.01
Paced = Callable[[AsyncGenerator[Any, None], float], AsyncGenerator[Any, None]]


async def _engine(tokens: int) -> AsyncGenerator[Any, None]:
    for i in range(tokens):
        await asyncio.sleep(GAP_S)
        yield TokenChunk("x", (i,))
    yield Finished(Usage(1, tokens, 0), "stop")


async def _chunks(paced: Paced, interval_s: float, tokens: int) -> int:
    return sum([isinstance(item, TokenChunk)
                async for item in paced(_engine(tokens), interval_s)])


def measure(paced: Paced, interval_s: float, tokens: int = TOKENS) -> tuple[float, float]:
    """(process CPU µs per token, chunks per stream) for ``STREAMS`` streams at once."""
    async def run() -> list[int]:
        return await asyncio.gather(*(_chunks(paced, interval_s, tokens)
                                      for _ in range(STREAMS)))
    with timing() as t:
        chunks = asyncio.run(run())
    return 1e6 * t.cpu_s / (STREAMS * tokens), sum(chunks) / STREAMS


def _load(path: str | None) -> Paced:
    if path is None:
        return stream_pacing.paced
    spec = importlib.util.spec_from_file_location("pacing_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.paced  # type: ignore[no-any-return]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", help="a stream_pacing.py to measure instead of this tree's")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=TOKENS)


def run(args: argparse.Namespace) -> int:
    paced = _load(args.impl)
    print("| round | interval ms | CPU µs per token | chunks per stream |")
    print("|---:|---:|---:|---:|")
    for r in range(args.rounds):
        for interval_s in (0.0, 0.02):
            us, chunks = measure(paced, interval_s, args.tokens)
            print(f"| {r + 1} | {interval_s * 1e3:g} | {us:.1f} | {chunks:.0f} |", flush=True)
    return 0
