"""The event accumulator every API's output builds on: the rules a reply's events follow,
whatever its wire format.

- Reasoning and answer text come as pieces of one kind at a time: a piece of another kind
  (or a tool call) closes the open one first (``close``), and opens its own (``begin``).
- ``single_call`` (``parallel_tool_calls: false``, ``disable_parallel_tool_use``) keeps
  the first tool call only.
- Every kept call counts in ``telemetry.current().tool_calls``: the turn ends in a tool
  call, which sets its session's lease (``router.routing.leases``).

Subclasses give the bytes: ``begin``, ``delta``, ``close`` and ``call`` return what a
stream sends for them (b"" for nothing) and keep what the whole reply needs.
"""

from __future__ import annotations

from router import telemetry
from router.output.events import Event, Reasoning, ToolCall

TEXT, REASONING = "text", "reasoning"


class Output:
    def __init__(self, single_call: bool = False) -> None:
        self.single = single_call
        self.calls: list[ToolCall] = []
        self.open: str | None = None  # the kind of the piece being sent: TEXT, REASONING

    def add(self, ev: Event) -> bytes:
        """One event; what a stream sends for it."""
        if isinstance(ev, str):  # most events: a token's text
            return self.delta(TEXT, ev) if self.open == TEXT else self._switch(TEXT, ev)
        if isinstance(ev, Reasoning):
            if self.open == REASONING:
                return self.delta(REASONING, ev.text)
            return self._switch(REASONING, ev.text)
        if self.single and self.calls:
            return b""
        self.calls.append(ev)
        telemetry.current().tool_calls += 1  # the turn ends in a tool call
        return self.end_piece() + self.call(ev, len(self.calls) - 1)

    def _switch(self, kind: str, text: str) -> bytes:
        head = self.end_piece()
        self.open = kind
        return head + self.begin(kind) + self.delta(kind, text)

    def end_piece(self) -> bytes:
        """Close the open piece, if any."""
        if self.open is None:
            return b""
        kind, self.open = self.open, None
        return self.close(kind)

    def begin(self, kind: str) -> bytes:
        return b""

    def delta(self, kind: str, text: str) -> bytes:
        raise NotImplementedError

    def close(self, kind: str) -> bytes:
        return b""

    def call(self, call: ToolCall, index: int) -> bytes:
        raise NotImplementedError
