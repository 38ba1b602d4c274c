"""Stream pacing (``ModelConfig.stream_interval_ms``): at most one token chunk per
interval leaves a replica; the tokens released meanwhile go out merged in the next.

Why: past the first token, every chunk costs the worker a frame, the router a read, an
SSE event and a write to the client, and on a VM each of those system calls and wake-ups
is tens of microseconds: per-token overhead was over half the router's CPU per agent
turn (docs/benchmarks.md, issue 16). vLLM, SGLang and TensorRT-LLM offer the same knob
(``stream_interval``, in tokens); here it is in time, so a slow stream is never held:
with 40 ms between tokens, a 20 ms interval changes nothing.

Never held: the first chunk (time to first token), and the end (a ``Finished`` or a
``Rejected`` flushes what is held and follows at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TypeVar

from workers.protocol import TokenChunk

T = TypeVar("T")


def paced(items: AsyncGenerator[T, None], interval_s: float) -> AsyncGenerator[T, None]:
    """``items`` with consecutive ``TokenChunk``s merged so that chunks leave at least
    ``interval_s`` apart; ``items`` itself when 0 (no layer per token). Closing the paced
    stream closes ``items``."""
    return _paced(items, interval_s) if interval_s > 0 else items


async def _paced(items: AsyncGenerator[T, None], interval_s: float
                 ) -> AsyncGenerator[T, None]:
    loop = asyncio.get_running_loop()
    held: TokenChunk | None = None
    sent_at = -interval_s
    # the engine's next item, awaited in a task only while tokens are held (a wait that
    # may time out must not cancel the engine's stream)
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if held is not None:
                if pending is None:
                    pending = asyncio.ensure_future(anext(items))
                await asyncio.wait({pending}, timeout=max(0.0, sent_at + interval_s
                                                          - loop.time()))
                if not pending.done():
                    yield held  # type: ignore[misc]
                    held, sent_at = None, loop.time()
                    continue
            try:
                if pending is not None:
                    item = await pending
                    pending = None
                else:
                    item = await anext(items)
            except StopAsyncIteration:
                break
            if not isinstance(item, TokenChunk):
                if held is not None:
                    yield held  # type: ignore[misc]
                    held = None
                yield item
            elif held is None and loop.time() - sent_at >= interval_s:
                yield item
                sent_at = loop.time()
            else:
                held = item if held is None else held.then(item)
        if held is not None:
            yield held  # type: ignore[misc]
    finally:
        if pending is not None:
            if not pending.done():
                pending.cancel()  # ends the engine's stream where it waits
                await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # retrieved: an error here is the stream's end anyway
        await items.aclose()
