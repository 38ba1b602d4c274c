"""The sim engine emulator: the Engine adapter in real time, the core in virtual time."""

from __future__ import annotations

import asyncio
import time

import pytest

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent
from cache_service.hashing import block_hashes, model_salt
from workers.engines.sim.core import SimCore, SimFinish, SimOutput, SimParams, SimRequest, sim_token
from workers.engines.sim.engine import SimEngine, token_text
from workers.protocol import (
    AutoscalingStats,
    BackgroundWork,
    Engine,
    EngineError,
    Finished,
    GenerateRequest,
    LoadStats,
    SamplingParams,
    TokenChunk,
)

MODEL = "sim/test-model"
BS = 16
FAST = SimParams(block_size=BS, prefill_tok_s=1e7, tpot_s=0.001, tpot_per_batch_s=0.0)


async def make_engine(params: SimParams = FAST, replica: str = "r0") -> SimEngine:
    engine = SimEngine(MODEL, replica, BS, params)
    await engine.start()
    return engine


def prompt(n: int, base: int = 0) -> list[int]:
    return [(base + i * 7) % 1000 for i in range(n)]


async def run(
    engine: SimEngine, tokens: list[int], rid: str = "a", **sampling: object
) -> tuple[list[TokenChunk], Finished]:
    chunks: list[TokenChunk] = []
    req = GenerateRequest(rid, tokens, SamplingParams(**sampling))  # type: ignore[arg-type]
    async for item in engine.generate(req):
        if isinstance(item, Finished):
            return chunks, item
        chunks.append(item)
    raise AssertionError("stream ended without Finished")


def stored(events: list[CacheEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.hashes]


def removed(events: list[CacheEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.hashes]


# -- the adapter, in real time ----------------------------------------------------------
async def test_streams_chunks_then_finished_with_usage() -> None:
    engine = await make_engine()
    assert isinstance(engine, Engine) and "emulator" in engine.label
    chunks, fin = await run(engine, prompt(100), max_tokens=5)
    ids = [t for c in chunks for t in c.token_ids]
    assert len(ids) == 5 and fin.finish_reason == "length"
    assert "".join(c.text for c in chunks) == "".join(token_text(t) for t in ids)
    assert (fin.usage.prompt_tokens, fin.usage.completion_tokens) == (100, 5)
    assert fin.usage.cached_tokens == 0
    assert engine.load().ongoing_requests == 0
    await engine.shutdown()


async def test_tokens_are_deterministic_across_engines() -> None:
    a, b = await make_engine(), await make_engine(replica="r1")
    ca, _ = await run(a, prompt(40), max_tokens=8, seed=3)
    cb, _ = await run(b, prompt(40), max_tokens=8, seed=3)
    cc, _ = await run(b, prompt(40), "c", max_tokens=8, seed=4)
    ids = [t for c in ca for t in c.token_ids]
    assert ids == [t for c in cb for t in c.token_ids]
    assert ids != [t for c in cc for t in c.token_ids]
    assert all(0 <= t < FAST.vocab_size for t in ids)
    await a.shutdown()
    await b.shutdown()


async def test_stop_string_and_eos() -> None:
    engine = await make_engine()
    full, _ = await run(engine, prompt(30), max_tokens=10)
    text = "".join(c.text for c in full)
    stop = token_text([t for c in full for t in c.token_ids][3])
    chunks, fin = await run(engine, prompt(30), "b", max_tokens=10, stop=(stop,))
    assert fin.finish_reason == "stop"
    assert "".join(c.text for c in chunks) == text[: text.find(stop)]
    assert fin.usage.completion_tokens == len([t for c in chunks for t in c.token_ids])
    await engine.shutdown()

    eos = await make_engine(SimParams(block_size=BS, prefill_tok_s=1e7, tpot_s=0.001, eos_every=4))
    chunks, fin = await run(eos, prompt(30), max_tokens=10)
    assert fin.finish_reason == "stop" and fin.usage.completion_tokens == 3
    _, fin = await run(eos, prompt(30), "b", max_tokens=10, ignore_eos=True)
    assert fin.finish_reason == "length" and fin.usage.completion_tokens == 10
    await eos.shutdown()


async def test_stop_string_on_a_late_tick() -> None:
    """A tick that fires after the whole generation was due (a busy loop): the core runs
    to the request's end in one advance, and the stop string still ends the stream."""
    engine = await make_engine()
    full, _ = await run(engine, prompt(30), max_tokens=10)
    stop = token_text([t for c in full for t in c.token_ids][3])
    task = asyncio.create_task(run(engine, prompt(30), "late", max_tokens=10, stop=(stop,)))
    await asyncio.sleep(0)  # submitted, its tick scheduled
    time.sleep(0.1)  # noqa: ASYNC251 (on purpose: the loop is blocked past the generation's end)
    chunks, fin = await asyncio.wait_for(task, 10)
    assert fin.finish_reason == "stop"
    assert fin.usage.completion_tokens == len([t for c in chunks for t in c.token_ids]) == 4
    await engine.shutdown()


async def test_repeated_prompt_is_cached_with_canonical_events() -> None:
    engine = await make_engine()
    tokens = prompt(300)
    _, first = await run(engine, tokens, max_tokens=2)
    expected = block_hashes(tokens, BS, model_salt(MODEL))
    events = engine.drain_cache_events()
    assert stored(events) == expected and all(e.replica == "r0" for e in events)
    _, second = await run(engine, tokens, "b", max_tokens=2)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == len(expected) * BS >= 0.8 * len(tokens)
    assert engine.drain_cache_events() == []  # nothing new to store
    await engine.shutdown()
    assert isinstance(engine.drain_cache_events()[-1], AllBlocksCleared)


async def test_abort_explicit_and_by_closing_the_stream() -> None:
    engine = await make_engine()
    gen = engine.generate(GenerateRequest("a", prompt(64), SamplingParams(max_tokens=10_000)))
    assert isinstance(await gen.__anext__(), TokenChunk)
    await engine.abort("a")
    items = [item async for item in gen]
    assert isinstance(items[-1], Finished) and items[-1].finish_reason == "abort"
    assert engine.load().ongoing_requests == 0

    gen = engine.generate(GenerateRequest("b", prompt(64), SamplingParams(max_tokens=10_000)))
    await gen.__anext__()
    assert engine.load().ongoing_requests == 1 and engine.load().kv_usage > 0
    await gen.aclose()  # the client disconnected
    load = engine.load()
    assert (load.ongoing_requests, load.kv_usage) == (0, 0.0)
    await engine.shutdown()


async def test_shutdown_aborts_and_fails_health() -> None:
    engine = await make_engine()
    await engine.check_health()
    gen = engine.generate(GenerateRequest("a", prompt(64), SamplingParams(max_tokens=10_000)))
    await gen.__anext__()
    await engine.shutdown()
    items = [item async for item in gen]
    assert isinstance(items[-1], Finished) and items[-1].finish_reason == "abort"
    with pytest.raises(EngineError):
        await engine.check_health()
    with pytest.raises(EngineError):
        await run(engine, prompt(10))


async def test_concurrent_streams_finish() -> None:
    engine = await make_engine()
    results = await asyncio.gather(
        *(run(engine, prompt(50, base=i), f"r{i}", max_tokens=6) for i in range(8))
    )
    assert all(fin.usage.completion_tokens == 6 for _, fin in results)
    await engine.shutdown()


# -- the core, in virtual time ----------------------------------------------------------
def drain(core: SimCore, until: float = float("inf")) -> list[SimOutput]:
    out: list[SimOutput] = []
    while (t := core.next_event_time()) is not None and t <= until:
        out += core.advance(t)
    return out


def first_token_times(outs: list[SimOutput]) -> dict[str, float]:
    times: dict[str, float] = {}
    for o in outs:
        times.setdefault(o.request_id, o.time)
    return times


def test_fifo_prefill_ttft_in_virtual_time() -> None:
    p = SimParams(block_size=10, prefill_tok_s=1000.0)
    core = SimCore(p)
    core.submit(SimRequest("warm", list(range(1, 31)), 300, 1), 0.0)
    drain(core)  # caches blocks 1..30
    t0 = 10.0
    a = SimRequest("a", [*range(1, 21), *range(100, 110)], 305, 2)  # 200 cached, 105 not
    b = SimRequest("b", list(range(200, 240)), 400, 2)  # nothing cached
    core.submit(a, t0)
    core.submit(b, t0)
    assert core.load().queued_prefill_tokens == 105 + 400
    outs = drain(core)
    ttft = first_token_times(outs)
    assert ttft["a"] - t0 == pytest.approx(105 / 1000)
    assert ttft["b"] - t0 == pytest.approx((105 + 400) / 1000)
    fins = {o.request_id: o for o in outs if isinstance(o, SimFinish)}
    assert fins["a"].cached_tokens == 200 and fins["b"].cached_tokens == 0
    full = SimRequest("full", list(range(1, 31)), 300, 1)  # fully cached: one token computed
    core.submit(full, 20.0)
    fin = [o for o in drain(core) if isinstance(o, SimFinish)][0]
    assert fin.cached_tokens == 299 and fin.time == pytest.approx(20.0 + 1 / 1000)


def test_decode_step_grows_with_batch() -> None:
    p = SimParams(prefill_tok_s=1e9, tpot_s=0.01, tpot_per_batch_s=0.001)
    core = SimCore(p)
    core.submit(SimRequest("solo", [], 1, 5), 0.0)
    times = [o.time for o in drain(core) if not isinstance(o, SimFinish)]
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == pytest.approx([0.01] * 4)

    for rid in "abc":
        core.submit(SimRequest(rid, [], 1, 6), 1.0)
    outs = drain(core)
    for rid in "abc":
        ts = [o.time for o in outs if o.request_id == rid and not isinstance(o, SimFinish)]
        steps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
        assert steps[1:] == pytest.approx([0.01 + 2 * 0.001] * 4)


def test_tokens_are_a_pure_function() -> None:
    core = SimCore(SimParams(prefill_tok_s=1e9, tpot_s=0.0))
    core.submit(SimRequest("x", [], 5, 4, prompt_key=42, seed=7), 0.0)
    ids = [o.token_id for o in drain(core) if not isinstance(o, SimFinish)]
    assert ids == [sim_token(42, 7, i, 4096) for i in range(4)]


def test_scripted_tokens_replace_sim_tokens_and_end_with_stop() -> None:
    p = SimParams(prefill_tok_s=1000.0, tpot_s=0.01, tpot_per_batch_s=0.0, eos_every=2)
    core = SimCore(p)
    core.submit(SimRequest("s", [], 100, 10, script=(7, 8, 9), eos=False), 0.0)
    outs = drain(core)
    toks = [o for o in outs if not isinstance(o, SimFinish)]
    assert [o.token_id for o in toks] == [7, 8, 9]  # eos_every does not cut a script
    assert [o.time for o in toks] == pytest.approx([0.1, 0.11, 0.12])
    fin = outs[-1]
    assert isinstance(fin, SimFinish) and fin.reason == "stop"
    assert (fin.completion_tokens, fin.time) == (3, pytest.approx(0.12))
    core.submit(SimRequest("cut", [], 1, 2, script=(7, 8, 9)), 1.0)
    fin = drain(core)[-1]
    assert isinstance(fin, SimFinish) and (fin.reason, fin.completion_tokens) == ("length", 2)
    core.submit(SimRequest("empty", [], 1, 5, script=()), 2.0)
    (fin,) = drain(core)
    assert isinstance(fin, SimFinish) and (fin.reason, fin.completion_tokens) == ("stop", 0)


def test_lru_eviction_and_pinned_blocks() -> None:
    core = SimCore(SimParams(kv_blocks=4, block_size=4, prefill_tok_s=1e6, tpot_s=0.01), "m", "r")
    core.submit(SimRequest("a", [1, 2, 3], 12, 1), 0.0)
    drain(core)
    assert stored(core.drain_events()) == [1, 2, 3] and core.load().kv_usage == 0.0

    core.submit(SimRequest("b", [10, 11, 12], 12, 1), 1.0)
    drain(core)
    events = core.drain_events()
    assert removed(events) == [3, 2]  # the deepest block of a prefix goes first
    assert stored(events) == [10, 11, 12]

    # "long" pins its blocks while it decodes: a newcomer cannot evict them.
    core.submit(SimRequest("long", [10, 11, 12], 12, 100), 2.0)
    drain(core, until=2.1)
    core.submit(SimRequest("c", [20, 21, 22], 12, 1), 2.1)
    drain(core, until=2.2)
    events = core.drain_events()
    assert removed(events) == [1] and stored(events) == [20]
    assert core.load().kv_usage == pytest.approx(3 / 4)
    fin = core.cancel("long", 2.3)
    assert fin is not None and fin.reason == "abort" and fin.cached_tokens == 11
    core.submit(SimRequest("d", [30, 31], 8, 1), 2.4)
    drain(core)
    events = core.drain_events()
    assert removed(events) == [20, 12] and stored(events) == [30, 31]


def test_cancel_while_queued_or_prefilling() -> None:
    core = SimCore(SimParams(prefill_tok_s=100.0))
    core.submit(SimRequest("a", [1, 2], 200, 3), 0.0)
    core.submit(SimRequest("b", [5, 6], 200, 3), 0.0)
    assert core.load().ongoing_requests == 2 and core.load().queued_prefill_tokens == 400
    fin = core.cancel("a", 0.5)  # mid-prefill: b starts now
    assert fin is not None and fin.completion_tokens == 0
    assert core.load().queued_prefill_tokens == 200
    outs = drain(core)
    assert first_token_times(outs)["b"] == pytest.approx(0.5 + 2.0)
    assert core.cancel("zzz", 10.0) is None
    load = core.load()
    assert (load.ongoing_requests, load.queued_prefill_tokens, load.kv_usage) == (0, 0, 0.0)
    # a's half-second of prefill before its cancel counts as work done, then all of b.
    assert load.prefill_tokens_total == 50 + 200
    assert load.prefill_busy_s == pytest.approx(0.5 + 2.0)


def test_load_reports_remaining_prefill_and_counters() -> None:
    core = SimCore(SimParams(prefill_tok_s=1000.0))
    core.submit(SimRequest("a", [1, 2], 2000, 3), 0.0)
    core.submit(SimRequest("b", [5, 6], 500, 3), 0.0)
    load = core.load(0.5)  # a is a quarter done; b waits
    assert load.queued_prefill_tokens == 1500 + 500 and load.remaining_prefill_exact
    assert (load.prefill_tokens_total, load.prefill_busy_s) == (500, 0.5)
    assert load.taken_at == 0.5
    drain(core, until=2.0)  # a ends at 2.0, b starts
    assert core.load(2.1).queued_prefill_tokens == 400
    assert core.load(2.1).prefill_tokens_total == 2100
    stats = core.load(2.1).routing_stats()
    assert stats["remaining_prefill_tokens"] == 400 and stats["stats_time"] == 2.1
    assert stats["prefill_busy_s"] == pytest.approx(2.1)
    assert LoadStats(1, 10, 0.0).routing_stats().keys() == {
        "ongoing_requests", "queued_prefill_tokens", "kv_usage", "stats_time"}


def test_autoscaling_stats_are_exact_seconds_and_round_trip_through_serve() -> None:
    core = SimCore(SimParams(prefill_tok_s=1000.0, tpot_s=0.01))
    core.submit(SimRequest("a", [1, 2], 2000, 1000), 0.0)
    core.submit(SimRequest("b", [5, 6], 500, 1000), 0.0)
    stats = AutoscalingStats.from_load(core.load(0.5), requests_total=2)
    # 1.5 s of a and 0.5 s of b left; 0.5 s done: 2.5 s of work given so far
    assert stats.backlog_s == pytest.approx(2.0) and stats.prefill_work_s == pytest.approx(2.5)
    assert (stats.decode_batch, stats.requests_total) == (0, 2)
    drain(core, until=2.2)  # a decodes, b has 0.3 s of prefill left
    later = AutoscalingStats.from_load(core.load(2.2), requests_total=2)
    assert later.decode_batch == 1 and later.backlog_s == pytest.approx(0.3, abs=0.01)
    assert later.prefill_work_s == pytest.approx(2.5, abs=0.01)  # no new work: flat
    serve = later.to_serve()
    assert all(k.startswith("kvroute_") for k in serve)
    assert AutoscalingStats.from_serve(serve) == later
    assert AutoscalingStats.from_serve({"kvroute_backlog_s": 1.0}) is None


def test_background_work_never_reads_as_offered_load() -> None:
    """A pre-warm: its prefill must not raise ``prefill_work_s`` while it runs,
    nor stay in it when it is cancelled at its time bound; user work still counts."""
    core, bg = SimCore(SimParams(prefill_tok_s=400.0)), BackgroundWork()

    def work(t: float) -> float:
        drain(core, until=t)
        return AutoscalingStats.from_load(core.load(t), 0, bg).prefill_work_s

    core.submit(SimRequest("warm", [1, 2], 8000, 1), 0.0)  # 20 s of prefill
    bg.begin(8000)
    assert [work(t) for t in (0.0, 2.0, 5.0, 9.9)] == [0.0] * 4  # not 1 prefill-s/s
    core.cancel("warm", 10.0)  # the pre-warm's timeout_s: no Final comes back
    bg.end(8000)
    assert work(12.0) == 0.0
    core.submit(SimRequest("user", [7, 8], 800, 1), 12.0)  # 2 s of a user's prefill
    assert work(12.0) == pytest.approx(2.0) and work(20.0) == pytest.approx(2.0)
    core.submit(SimRequest("warm2", [3, 4], 400, 1), 20.0)  # one that finishes
    bg.begin(400)
    assert work(20.5) == pytest.approx(2.0)
    bg.end(400)
    assert work(30.0) == pytest.approx(2.0)


def test_params_from_kwargs() -> None:
    p = SimParams.from_kwargs({"kv_blocks": "64", "tpot_s": 0.005}, block_size=32)
    assert (p.kv_blocks, p.tpot_s, p.block_size) == (64, 0.005, 32)
    with pytest.raises(ValueError):
        SimParams.from_kwargs({"bogus": 1}, block_size=32)
    with pytest.raises(ValueError):
        SimEngine(MODEL, "r", 64, SimParams(block_size=16))
