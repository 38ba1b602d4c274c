"""Stream pacing (``workers.transport.stream_pacing.paced``) over a scripted engine stream: the
same tokens in the same order, the first chunk and the end never held, chunks at least
an interval apart, and closing the paced stream closes the engine's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.protocol import Finished, TokenChunk, Usage
from workers.transport.stream_pacing import paced

END = Finished(Usage(1, 1, 0), "stop")


async def engine(gaps: list[float], log: list[str] | None = None
                 ) -> AsyncGenerator[object, None]:
    """One token per gap (seconds before it), then ``END``."""
    try:
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            yield TokenChunk(f"t{i} ", (i,))
        yield END
    finally:
        if log is not None:
            log.append("closed")


async def collect(interval_s: float, gaps: list[float]) -> list[tuple[float, object]]:
    t0 = time.monotonic()
    return [(time.monotonic() - t0, item) async for item in paced(engine(gaps), interval_s)]


def tokens(out: list[tuple[float, object]]) -> tuple[str, tuple[int, ...]]:
    chunks = [item for _, item in out if isinstance(item, TokenChunk)]
    return "".join(c.text for c in chunks), sum((c.token_ids for c in chunks), ())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.001, 0.004, 0.012]), max_size=12),
       st.sampled_from([0.0, 0.005, 0.01]))
def test_every_token_arrives_once_in_order_then_the_end(gaps: list[float],
                                                        interval_s: float) -> None:
    out = asyncio.run(collect(interval_s, gaps))
    assert tokens(out) == ("".join(f"t{i} " for i in range(len(gaps))),
                           tuple(range(len(gaps))))
    assert out[-1][1] == END
    assert all(isinstance(item, TokenChunk) for _, item in out[:-1])


async def test_chunks_leave_an_interval_apart_and_the_first_at_once() -> None:
    out = await collect(0.05, [0.0] + [0.005] * 40)  # 200 tok/s for 0.2 s
    chunks = [(t, item) for t, item in out if isinstance(item, TokenChunk)]
    assert chunks[0][1] == TokenChunk("t0 ", (0,))  # not held for company
    paced_ = chunks[:-1]  # the last one leaves with the end, at once
    gaps = [b[0] - a[0] for a, b in zip(paced_, paced_[1:], strict=False)]
    assert gaps and all(g >= 0.045 for g in gaps), gaps
    assert len(chunks) <= 8  # 41 tokens in ~0.2 s at one chunk per 50 ms (+ the first)


async def test_the_end_is_not_held() -> None:
    out = await collect(5.0, [0.0, 0.001])  # the second token comes inside the interval
    (_, first), (_, second), (t_end, end) = out
    assert first == TokenChunk("t0 ", (0,)) and second == TokenChunk("t1 ", (1,))
    assert end == END and t_end < 2.5  # flushed with the end, not after 5 s


async def test_a_slow_stream_is_not_held() -> None:
    out = await collect(0.01, [0.03] * 5)  # 30 ms between tokens, 10 ms interval
    assert [item for _, item in out][:-1] == [TokenChunk(f"t{i} ", (i,)) for i in range(5)]


async def test_closing_the_paced_stream_closes_the_engines() -> None:
    for interval_s in (0.0, 0.05):
        log: list[str] = []
        stream = paced(engine([0.0] + [0.01] * 100, log), interval_s)
        assert isinstance(await anext(stream), TokenChunk)
        await asyncio.sleep(0.02)  # tokens held, the engine waiting for its next
        await stream.aclose()
        assert log == ["closed"]


async def test_cancelling_the_reader_closes_the_engines() -> None:
    log: list[str] = []

    async def read() -> None:
        async for _ in paced(engine([0.0] + [0.01] * 100, log), 0.05):
            pass

    task = asyncio.ensure_future(read())
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert log == ["closed"]


async def test_an_engine_error_comes_after_the_tokens_before_it() -> None:
    async def failing() -> AsyncGenerator[object, None]:
        for i in range(6):
            await asyncio.sleep(0.001)
            yield TokenChunk(f"t{i} ", (i,))
        raise RuntimeError("engine died")

    got: list[object] = []
    try:
        async for item in paced(failing(), 5.0):  # everything after the first is held
            got.append(item)
    except RuntimeError as e:
        assert str(e) == "engine died"
    else:
        raise AssertionError("the engine's error was swallowed")
    assert "".join(c.text for c in got) == "".join(f"t{i} " for i in range(6))  # type: ignore[attr-defined]
    assert len(got) == 2  # the first at once, the rest flushed before the error

