"""``<think>…</think>`` reasoning: Qwen3, DeepSeek-R1/V3.1/V3.2, GLM-4.5/4.6, Kimi-K2, MiniMax-M2.

The reasoning comes first: the output either opens it (``<think>`` before any other
text) or the chat template already did (its generation prompt ends with ``<think>``,
as DeepSeek-V3.1 in thinking mode, Qwen3-Thinking-2507 and MiniMax-M2 do; then
``inside=True``). It ends at ``</think>`` or at a marker that implicitly ends it
(Kimi-K2's ``<|tool_calls_section_begin|>``, which stays in the answer for the tool
parser). Newlines right after the opener, right before the closer and at the start
of the answer are layout, not text (the templates strip them when rendering past
reasoning back), so they are dropped. An output that does not start with the opener
is all answer (all reasoning when the template opened it, until the closer); a
``<think>`` later on is the model's text.
"""

from __future__ import annotations

from router.output.reasoning_parsers.base import Piece, Reasoning, emit
from router.output.text_stream import Buffered, partial_suffix

_START, _INSIDE, _AFTER = range(3)


class ThinkParser(Buffered[Piece]):
    def __init__(self, inside: bool, start: str = "<think>", end: str = "</think>",
                 implicit_ends: tuple[str, ...] = ()) -> None:
        self._start, self._end, self._implicit = start, end, implicit_ends
        self._opened = inside  # the prompt opened the reasoning (an opener is still eaten)
        self._state = _START
        self._buf = ""
        self._lead = True  # at the start of the reasoning or the answer: drop newlines
        self._reasoned = False  # the reasoning was closed: the answer follows it

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._state == _INSIDE or (self._state == _START and self._opened):
            emit(out, Reasoning(self._buf.strip()))
        elif not (self._reasoned and self._end.startswith(self._buf)):
            emit(out, self._buf)
        self._buf = ""
        return out

    def _step(self, out: list[Piece]) -> bool:
        if self._lead:
            self._buf = self._buf.lstrip("\n") if self._state != _START else self._buf
            if not self._buf:
                return False
        if self._state == _START:
            head = self._buf.lstrip()
            if head.startswith(self._start):
                self._state, self._buf, self._lead = _INSIDE, head[len(self._start):], True
                return True
            if self._start.startswith(head):
                return False  # could still be the opener
            self._state, self._lead = (_INSIDE, True) if self._opened else (_AFTER, False)
            return True
        if self._state == _AFTER:
            return self._answer(out)
        return self._reasoning(out)

    def _answer(self, out: list[Piece]) -> bool:
        """After reasoning, a closer the model writes again is dropped (MiniMax-M2 does:
        vLLM's minimax_m2 test ``DOUBLE_END_TOKEN``); an answer without reasoning is
        passed through untouched."""
        hold = 0
        if self._reasoned:
            self._buf = self._buf.replace(self._end, "")
            hold = partial_suffix(self._buf, (self._end,))
        emit(out, self._buf[: len(self._buf) - hold])
        self._buf, self._lead = self._buf[len(self._buf) - hold:], False
        return False

    def _reasoning(self, out: list[Piece]) -> bool:
        cut, keep = -1, 0
        for marker in (self._end, *self._implicit):
            j = self._buf.find(marker)
            if j >= 0 and (cut < 0 or j < cut):
                cut, keep = j, 0 if marker == self._end else len(marker)
        if cut >= 0:
            emit(out, Reasoning(self._buf[:cut].rstrip()))
            rest = self._buf[cut:] if keep else self._buf[cut + len(self._end):]
            self._state, self._buf, self._lead = _AFTER, rest, True
            self._reasoned = True
            return True
        hold = partial_suffix(self._buf, (self._end, *self._implicit))
        safe = self._buf[: len(self._buf) - hold]
        body = safe.rstrip()  # trailing space waits: dropped if the closer follows
        emit(out, Reasoning(body))
        self._buf = self._buf[len(body):]
        self._lead = self._lead and not body
        return False
