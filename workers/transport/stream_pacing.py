"""Stream pacing (``ModelConfig.stream_interval_ms``): at most one token chunk per
interval leaves a replica; the tokens released meanwhile go out merged in the next.

Why: past the first token, every chunk costs the worker a frame, the router a read, an
SSE event and a write to the client, and on a VM each of those system calls and wake-ups
is tens of microseconds: per-token overhead was over half the router's CPU per agent
turn (docs/benchmarks.md, router overhead). vLLM, SGLang and TensorRT-LLM offer the same knob
(``stream_interval``, in tokens, default 1); here it is in time, so a slow stream is
never held: with 40 ms between tokens, a 20 ms interval changes nothing. kvroute's
default is 0 (off: a chunk per token, as vLLM's and SGLang's), because every benchmark
tool reads a chunk of k tokens as one inter-token gap of k TPOTs; 20 ms (50 chunks a
second, more than a reader or an agent's parser uses) takes CPU off the router tier on
fast streams (docs/benchmarks.md, "Stream pacing and the stream transport").

Never held: the first chunk (time to first token), and the end (a ``Finished`` or a
``Rejected`` flushes what is held and follows at once).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from typing import Generic, TypeVar

from workers.protocol import TokenChunk

T = TypeVar("T")


def paced(items: AsyncGenerator[T, None], interval_s: float) -> AsyncGenerator[T, None]:
    """``items`` with consecutive ``TokenChunk``s merged so that chunks leave at least
    ``interval_s`` apart; ``items`` itself when 0 (no layer per token). Closing the paced
    stream closes ``items``."""
    return _paced(items, interval_s) if interval_s > 0 else items


class _Pump(Generic[T]):
    """Reads the engine's stream into ``got`` from a task of its own, so the reader can
    sleep until a chunk is due without cancelling the engine's await. It wakes the reader
    only for what cannot wait: an item other than a chunk, the end, or a chunk once due;
    so a paced stream costs a task step per token and a wake-up per chunk."""

    def __init__(self, items: AsyncGenerator[T, None]) -> None:
        self.got: deque[T] = deque()
        self.end: BaseException | None = None  # StopAsyncIteration, or the engine's error
        self.due = 0.0  # the loop time from which a chunk may leave
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.task = asyncio.ensure_future(self._run(items))

    async def _run(self, items: AsyncGenerator[T, None]) -> None:
        try:
            async for item in items:
                self.got.append(item)
                if self._waiter is None:
                    continue  # the reader is busy; it looks at ``got`` before it waits
                if not isinstance(item, TokenChunk) or self._loop.time() >= self.due:
                    self._wake()
                elif self._timer is None:
                    self._timer = self._loop.call_at(self.due, self._wake)
        except Exception as e:  # the reader raises it, after the tokens before it
            self.end = e
        except BaseException as e:  # cancelled: by the reader's close, or with the loop
            self.end = e
            raise
        else:
            self.end = StopAsyncIteration()
        finally:
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, holding: bool) -> None:
        """Until something in ``got`` must be looked at: at once if it has anything or
        the stream ended; else at ``due`` if ``holding`` (a chunk waits to leave)."""
        if self.got or self.end is not None:
            return
        self._waiter = self._loop.create_future()
        if holding:
            self._timer = self._loop.call_at(self.due, self._wake)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


async def _paced(items: AsyncGenerator[T, None], interval_s: float
                 ) -> AsyncGenerator[T, None]:
    loop = asyncio.get_running_loop()
    pump = _Pump(items)
    held: TokenChunk | None = None
    try:
        while True:
            await pump.wait(holding=held is not None)
            while pump.got:
                item = pump.got.popleft()
                if isinstance(item, TokenChunk):
                    held = item if held is None else held.then(item)
                    continue
                if held is not None:  # the end and errors are never held
                    yield held  # type: ignore[misc]
                    held = None
                yield item
            if held is not None and (loop.time() >= pump.due or pump.end is not None):
                yield held  # type: ignore[misc]
                held, pump.due = None, loop.time() + interval_s
            if pump.end is not None and not pump.got and held is None:
                if isinstance(pump.end, StopAsyncIteration):
                    return
                raise pump.end
    finally:
        if not pump.task.done():
            pump.task.cancel()  # ends the engine's stream where it waits
            await asyncio.wait({pump.task})
        await items.aclose()
