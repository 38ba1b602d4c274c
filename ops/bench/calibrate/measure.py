"""The curves ``kvroute bench calibrate`` measures on one replica through kvroute: prefill
time over prompt lengths (cold), over cached prefix lengths (a fixed uncached suffix after
a prefix a previous request left in the cache), and the decode step over batch sizes.

Every prompt is token ids on ``/v1/completions`` (``ops.bench.harness.workloads``'s
generator: exact lengths, nothing shared unless asked), streamed, timed on the client:

* prefill: TTFT of a request with ``max_tokens`` 1;
* decode: ``b`` requests at once, short prompts, ``decode_tokens`` each; the step time
  is the median over the requests of (last token - first) / (tokens - 1).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

from ops.bench.harness.client import Client, Record
from ops.bench.harness.workloads import COMPLETIONS_PATH, BenchRequest, block_token_ids

VOCAB = 4096  # the tiny model's


@dataclass(frozen=True, slots=True)
class CurveSpec:
    lengths: tuple[int, ...] = (16, 64, 128, 256)  # cold prompts
    cached: tuple[int, ...] = (128, 256)  # cached prefix lengths (multiples of 128)
    suffix: int = 32  # the uncached rest after a cached prefix
    batches: tuple[int, ...] = (1, 2, 4, 8)
    decode_tokens: int = 24
    samples: int = 2


@dataclass(frozen=True, slots=True)
class Point:
    x: float  # prompt, cached prefix length or batch size
    seconds: float  # median TTFT or step time
    cached_tokens: float = 0.0  # median the engine reported


def ids(key: str, n: int) -> list[int]:
    """``n`` token ids, a pure function of ``key`` (no two keys share a first block)."""
    out: list[int] = []
    block = 0
    while len(out) < n:
        out.extend(block_token_ids(block, VOCAB, key))
        block += 1
    return out[:n]


def request(key: str, prompt: list[int], max_tokens: int) -> BenchRequest:
    return BenchRequest(key, COMPLETIONS_PATH,
                        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


async def _one(client: Client, req: BenchRequest) -> Record:
    rec = await client.send(req, 0.0)
    if not rec.ok:
        raise RuntimeError(f"calibration request {req.key} failed: {rec.error}")
    return rec


async def prefill_cold(client: Client, spec: CurveSpec, salt: str) -> list[Point]:
    points = []
    for n in spec.lengths:
        recs = [await _one(client, request(f"{salt}.cold{n}.{i}", ids(f"{salt}.c{n}.{i}", n), 1))
                for i in range(spec.samples)]
        points.append(_point(n, recs))
    return points


async def prefill_cached(client: Client, spec: CurveSpec, salt: str) -> list[Point]:
    """TTFT of ``suffix`` new tokens after a cached prefix of each length (0 included)."""
    points = []
    for c in (0, *spec.cached):
        recs = []
        for i in range(spec.samples):
            base = ids(f"{salt}.p{c}.{i}", c + spec.suffix)
            if c:
                await _one(client, request(f"{salt}.prime{c}.{i}", base, 1))
            tail = ids(f"{salt}.s{c}.{i}", spec.suffix)
            recs.append(await _one(client, request(f"{salt}.hit{c}.{i}", base[:c] + tail, 1)))
        points.append(_point(c, recs))
    return points


async def decode_steps(client: Client, spec: CurveSpec, salt: str) -> list[Point]:
    points = []
    for b in spec.batches:
        steps: list[float] = []
        for i in range(spec.samples):
            reqs = [request(f"{salt}.d{b}.{i}.{k}", ids(f"{salt}.d{b}.{i}.{k}", 8),
                            spec.decode_tokens) for k in range(b)]
            recs = await asyncio.gather(*(_one(client, r) for r in reqs))
            steps.extend(r.tpot_s for r in recs if r.tpot_s is not None)
        points.append(Point(b, statistics.median(steps) if steps else 0.0))
    return points


def _point(x: float, recs: list[Record]) -> Point:
    return Point(x, statistics.median(r.ttft_s or 0.0 for r in recs),
                 statistics.median(r.cached_tokens for r in recs))


async def curves(url: str, model: str, spec: CurveSpec, salt: str
                 ) -> dict[str, list[Point]]:
    async with Client(url, model) as client:
        await _one(client, request(f"{salt}.warm", ids(f"{salt}.warm", 16), 4))
        return {"prefill_cold": await prefill_cold(client, spec, salt),
                "prefill_cached": await prefill_cached(client, spec, salt),
                "decode": await decode_steps(client, spec, salt)}


async def overhead_s(url: str, model: str, samples: int = 8) -> float:
    """Median TTFT of a 4-token prompt: on a sim with no costs, the stack's own share."""
    async with Client(url, model) as client:
        recs = [await _one(client, request(f"o{i}", ids(f"overhead.{i}", 4), 1))
                for i in range(samples)]
    return statistics.median(r.ttft_s or 0.0 for r in recs)

