"""One Engine-protocol contract suite, run against every engine adapter.

``ENGINES`` is a small factory table keyed by engine name: each entry turns the
pytest request into an ``EngineCase`` that builds fresh engines (optionally with a
KV budget of ``kv_tokens`` tokens). To cover another engine, add an entry and its
name to ``PARAMS`` (marked slow if it takes more than a few seconds).

Engines are built and started inside each test, so they live on the test's own
event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from cache_service.events import BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes, model_salt, tenant_salt
from workers.protocol import (
    Engine,
    EngineError,
    Finished,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)

MODEL = "contract/model"
BS = 16  # canonical block size for these tests (small, so short prompts have blocks)


@dataclass(frozen=True)
class EngineCase:
    make: Callable[[int | None], Engine]  # kv_tokens budget (None: roomy) -> engine
    overlaps: bool = True  # concurrent requests progress together


def _sim(request: pytest.FixtureRequest) -> EngineCase:
    from workers.engines.sim.engine import SimEngine, SimParams

    def make(kv_tokens: int | None) -> Engine:
        params = SimParams(
            block_size=BS, prefill_tok_s=1e7, tpot_s=0.001, tpot_per_batch_s=0.0,
            kv_blocks=kv_tokens // BS if kv_tokens else 1000,
        )
        return SimEngine(MODEL, "r0", BS, params)

    return EngineCase(make)


def _mlx(request: pytest.FixtureRequest) -> EngineCase:
    from ops.models import tiny_model as tm
    from workers.engines.mlx.engine import MlxEngine

    model_dir: Path = request.getfixturevalue("tiny_model_dir")
    kv_bytes_per_token = tm.NUM_LAYERS * 2 * tm.NUM_KV_HEADS * tm.HEAD_DIM * 4  # float32 K+V

    def make(kv_tokens: int | None) -> Engine:
        budget = kv_tokens * kv_bytes_per_token if kv_tokens else 1 << 30
        return MlxEngine(str(model_dir), MODEL, "r0", BS, cache_bytes=budget)

    return EngineCase(make)


ENGINES: dict[str, Callable[[pytest.FixtureRequest], EngineCase]] = {"sim": _sim, "mlx": _mlx}
PARAMS = ["sim", pytest.param("mlx", marks=pytest.mark.slow)]


@pytest.fixture(params=PARAMS)
def case(request: pytest.FixtureRequest) -> EngineCase:
    return ENGINES[request.param](request)


@asynccontextmanager
async def running(case: EngineCase, kv_tokens: int | None = None) -> AsyncIterator[Engine]:
    engine = case.make(kv_tokens)
    assert isinstance(engine, Engine)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


def prompt(n: int, base: int = 0) -> list[int]:
    """Ordinary token ids (no special ids 0..4), distinct per ``base``."""
    return [5 + (base * 997 + i * 7) % 4000 for i in range(n)]


def req(rid: str, tokens: list[int], **sampling: object) -> GenerateRequest:
    sampling.setdefault("ignore_eos", True)
    return GenerateRequest(rid, tokens, SamplingParams(**sampling))  # type: ignore[arg-type]


async def run(engine: Engine, request: GenerateRequest) -> tuple[list[TokenChunk], Finished]:
    chunks: list[TokenChunk] = []
    async for item in engine.generate(request):
        if isinstance(item, Finished):
            return chunks, item
        chunks.append(item)
    raise AssertionError("stream ended without Finished")


def ids(chunks: list[TokenChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def text(chunks: list[TokenChunk]) -> str:
    return "".join(c.text for c in chunks)


def hashes_of(events: list[CacheEvent], kind: type) -> list[int]:
    return [h for e in events if isinstance(e, kind) for h in e.hashes]  # type: ignore[attr-defined]


# -- streaming and limits -------------------------------------------------------------
async def test_streams_chunks_then_finished(case: EngineCase) -> None:
    async with running(case) as engine:
        items = [item async for item in engine.generate(req("a", prompt(64), max_tokens=8))]
        *chunks, fin = items
        assert isinstance(fin, Finished) and all(isinstance(c, TokenChunk) for c in chunks)
        assert fin.finish_reason == "length"
        assert (fin.usage.prompt_tokens, fin.usage.completion_tokens) == (64, 8)
        assert fin.usage.cached_tokens == 0
        assert len(ids(chunks)) == 8 and text(chunks)  # type: ignore[arg-type]
        load = engine.load()
        assert (load.ongoing_requests, load.queued_prefill_tokens) == (0, 0)


async def test_max_tokens(case: EngineCase) -> None:
    async with running(case) as engine:
        for n in (1, 3):
            chunks, fin = await run(engine, req(f"m{n}", prompt(40, n), max_tokens=n))
            assert (fin.usage.completion_tokens, len(ids(chunks))) == (n, n)
            assert fin.finish_reason == "length"


async def test_stop_sequence_cuts_the_text(case: EngineCase) -> None:
    async with running(case) as engine:
        tokens = prompt(48, 3)
        chunks, _ = await run(engine, req("ref", tokens, max_tokens=12))
        full = text(chunks)
        stop = full[len(full) // 2 :][:3]  # a stop string the engine really produces
        assert stop.strip()
        chunks, fin = await run(engine, req("cut", tokens, max_tokens=12, stop=(stop,)))
        assert fin.finish_reason == "stop"
        assert text(chunks) == full[: full.index(stop)]
        assert fin.usage.completion_tokens == len(ids(chunks)) < 12


# -- abort ----------------------------------------------------------------------------
async def test_closing_the_stream_aborts(case: EngineCase) -> None:
    async with running(case) as engine:
        stream = engine.generate(req("x", prompt(32), max_tokens=2000))
        got = [await stream.__anext__(), await stream.__anext__()]
        assert all(isinstance(c, TokenChunk) for c in got)
        await stream.aclose()  # type: ignore[attr-defined]
        assert engine.load().ongoing_requests == 0
        _, fin = await run(engine, req("y", prompt(32, 1), max_tokens=2))  # still serving
        assert fin.finish_reason == "length"
        assert engine.load().ongoing_requests == 0


async def test_abort_by_id(case: EngineCase) -> None:
    async with running(case) as engine:
        stream = engine.generate(req("x", prompt(32), max_tokens=2000))
        assert isinstance(await stream.__anext__(), TokenChunk)
        await engine.abort("x")
        rest = [item async for item in stream]
        fin = rest[-1]
        assert isinstance(fin, Finished) and fin.finish_reason == "abort"
        assert 1 <= fin.usage.completion_tokens < 2000
        assert engine.load().ongoing_requests == 0


# -- prefix cache and its events --------------------------------------------------------
async def test_repeat_reuses_cached_prefix(case: EngineCase) -> None:
    async with running(case) as engine:
        tokens = prompt(160, 5)
        _, first = await run(engine, req("a", tokens, max_tokens=4))
        _, again = await run(engine, req("b", tokens, max_tokens=4))
        assert first.usage.cached_tokens == 0
        assert 0.8 * len(tokens) <= again.usage.cached_tokens < len(tokens)


async def test_block_stored_hashes_are_canonical(case: EngineCase) -> None:
    async with running(case) as engine:
        tokens = prompt(100, 6)  # 6 full blocks and a partial one
        await run(engine, req("a", tokens, max_tokens=4))
        events = engine.drain_cache_events()
        expected = block_hashes(tokens, BS, model_salt(MODEL))
        assert len(expected) == 6
        assert hashes_of(events, BlockStored)[: len(expected)] == expected
        assert not hashes_of(events, BlockRemoved)
        assert engine.drain_cache_events() == []  # drained


async def test_cache_salts_keep_tenants_apart(case: EngineCase) -> None:
    """Tenant isolation: a prompt reuses only KV stored under its own cache salt (the tenant),
    and the salt enters the events' hashes, as it enters the router's lookups."""
    async with running(case) as engine:
        tokens = prompt(100, 8)  # 6 full blocks
        await run(engine, GenerateRequest("a", tokens, SamplingParams(max_tokens=4), "alice"))
        events = engine.drain_cache_events()
        _, bob = await run(engine, GenerateRequest("b", tokens, SamplingParams(max_tokens=4),
                                                   "bob"))
        _, alice = await run(engine, GenerateRequest("c", tokens, SamplingParams(max_tokens=4),
                                                     "alice"))
        assert bob.usage.cached_tokens == 0
        assert alice.usage.cached_tokens >= 0.8 * len(tokens)
        salted = block_hashes(tokens, BS, tenant_salt(model_salt(MODEL), "alice"))
        assert hashes_of(events, BlockStored)[:6] == salted
        assert not set(salted) & set(block_hashes(tokens, BS, model_salt(MODEL)))


async def test_small_budget_evicts(case: EngineCase) -> None:
    budget = 256  # tokens: room for two of the prompts below, not four
    async with running(case, kv_tokens=budget) as engine:
        held: set[int] = set()
        removed: list[int] = []
        firsts = []
        for i in range(4):
            tokens = prompt(96, 10 + i)
            firsts.append(block_hashes(tokens, BS, model_salt(MODEL))[0])
            await run(engine, req(f"e{i}", tokens, max_tokens=4))
            events = engine.drain_cache_events()
            held |= set(hashes_of(events, BlockStored))
            held -= set(gone := hashes_of(events, BlockRemoved))
            removed += gone
            assert len(held) <= budget // BS
            assert 0.0 <= engine.load().kv_usage <= 1.0
        assert removed
        assert firsts[0] not in held and firsts[-1] in held  # LRU: oldest went first


# -- concurrency --------------------------------------------------------------------------
async def test_concurrent_requests_complete_and_overlap(case: EngineCase) -> None:
    async with running(case) as engine:
        start = time.perf_counter()
        seen_ongoing: list[int] = []
        seen_batch: list[int] = []  # sequences past prefill (vLLM: running, a bound)

        async def timed(i: int) -> tuple[float, float, Finished]:
            first = -1.0
            async for item in engine.generate(req(f"c{i}", prompt(32, 20 + i), max_tokens=48)):
                if first < 0:
                    first = time.perf_counter() - start
                    seen_ongoing.append(engine.load().ongoing_requests)
                    seen_batch.append(engine.load().decode_batch)
                if isinstance(item, Finished):
                    return first, time.perf_counter() - start, item
            raise AssertionError("no Finished")

        results = await asyncio.gather(*(timed(i) for i in range(3)))
        assert all(f.usage.completion_tokens == 48 for _, _, f in results)
        assert max(seen_ongoing) == 3
        assert all(0 <= b <= 3 for b in seen_batch)
        if case.overlaps:  # every request started before any finished
            assert max(r[0] for r in results) < min(r[1] for r in results)
        assert engine.load().ongoing_requests == 0


async def test_queued_prefill_tokens(case: EngineCase) -> None:
    async with running(case) as engine:
        tokens = prompt(300, 30)
        stream = engine.generate(req("q", tokens, max_tokens=2))
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the request is submitted, its first token not out yet
        load = engine.load()
        assert 0 <= load.queued_prefill_tokens <= len(tokens)
        # Its prefill is still queued, or (remaining-prefill engines) already counted done.
        assert load.queued_prefill_tokens > 0 or load.prefill_tokens_total > 0
        assert isinstance(await first, TokenChunk)
        assert engine.load().queued_prefill_tokens == 0
        assert isinstance([item async for item in stream][-1], Finished)


async def test_seeded_sampling_is_reproducible_in_a_batch(case: EngineCase) -> None:
    async with running(case) as engine:
        tokens = prompt(40, 40)
        sampling = {"max_tokens": 8, "temperature": 1.0, "seed": 7}
        alone, _ = await run(engine, req("s0", tokens, **sampling))
        batched, other = await asyncio.gather(
            run(engine, req("s1", tokens, **sampling)),
            run(engine, req("s2", tokens, **{**sampling, "seed": 8})),
        )
        assert ids(batched[0]) == ids(alone)
        assert ids(other[0]) != ids(alone)


# -- lifecycle ---------------------------------------------------------------------------
async def test_health_and_shutdown(case: EngineCase) -> None:
    before = set(threading.enumerate())
    engine = case.make(None)
    await engine.start()
    await engine.check_health()
    await run(engine, req("h", prompt(20), max_tokens=2))
    await engine.shutdown()
    with pytest.raises(EngineError):
        await engine.check_health()
    with pytest.raises(EngineError):
        await run(engine, req("late", prompt(20), max_tokens=2))
    left = [t for t in set(threading.enumerate()) - before if not t.name.startswith("asyncio")]
    assert not [t for t in left if t.is_alive()]
