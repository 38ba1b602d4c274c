"""Model text → events: the one place a generation's text becomes reasoning, answer text
and tool calls, for every API and the replicas' own endpoint.

The reasoning parser runs first (``router.output.reasoning_parsers``); the tool-call
parser (``router.output.tool_calls``) reads the answer text it leaves. Either may be None:
no reasoning format, or no tools offered (the text passes through).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.output.reasoning_parsers.base import Piece, Reasoning, ReasoningParser
from router.output.tool_parsers import ToolCall, ToolParser
from workers.protocol import Chunk, WorkerMessage

__all__ = ["Event", "Reasoning", "ToolCall", "event_batches", "events"]
Event = Reasoning | str | ToolCall


async def event_batches(messages: AsyncIterator[WorkerMessage], tools: ToolParser | None,
                        reasoning: ReasoningParser | None) -> AsyncIterator[list[Event]]:
    """Worker messages → events: one list per worker message that gave any, the parsers'
    flush last. A list is what a stream sends in one write."""

    def answer(pieces: list[Piece]) -> list[Event]:
        out: list[Event] = []
        for p in pieces:
            if isinstance(p, Reasoning):
                out.append(p)
            elif tools is not None:
                out.extend(tools.feed(p))
            else:
                out.append(p)
        return out

    async for msg in messages:
        if isinstance(msg, Chunk) and (text := msg.text):
            if reasoning is not None:
                if batch := answer(reasoning.feed(text)):
                    yield batch
            elif tools is None:
                yield [text]
            elif batch := tools.feed(text):  # ``answer([text])`` without its list and loop
                yield batch
    tail = answer(reasoning.flush() if reasoning else [])
    if tools is not None:
        tail.extend(tools.flush())
    if tail:
        yield tail


async def events(messages: AsyncIterator[WorkerMessage], tools: ToolParser | None,
                 reasoning: ReasoningParser | None) -> AsyncIterator[Event]:
    """``event_batches``, one event at a time (the replies that are not streamed)."""
    async for batch in event_batches(messages, tools, reasoning):
        for ev in batch:
            yield ev
