"""gpt-oss harmony reasoning: the ``analysis`` channel is reasoning, ``final`` the answer.

The output is a run of messages after the prompt's ``<|start|>assistant``::

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>

A message's header runs up to ``<|message|>`` and its body up to ``<|end|>``,
``<|call|>`` or ``<|return|>`` (or the end of the output). Bodies of ``analysis``
messages are ``Reasoning``; bodies of ``final`` and of ``commentary`` messages
without a recipient (preambles the user sees) are answer text. A message with a
recipient (``to=functions.name``: a tool call, or a built-in tool) passes through
verbatim, header and terminator included, as answer text for the tool-call parser.
An output that does not start like a harmony message is passed through unchanged.

Format: https://github.com/openai/harmony (docs/format.md); vLLM keeps the same split
(vllm/reasoning/gptoss_reasoning_parser.py, vllm/entrypoints/harmony_utils.py).
"""

from __future__ import annotations

import re
from typing import Any

from router.output.reasoning_parsers.base import Piece, Reasoning, emit
from router.output.text_stream import Buffered, partial_suffix

MESSAGE = "<|message|>"
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
_OPENERS = ("<|channel|>", "<|start|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=\S")
_HEADER, _BODY, _PLAIN = range(3)
_MAX_HEADER = 512  # longer than any header: the output is not harmony after all


class HarmonyParser(Buffered[Piece]):
    def __init__(self, inside: bool = False) -> None:
        del inside  # the prompt always ends at a header's start (``<|start|>assistant``)
        self._state = _HEADER
        self._buf = ""
        self._header = ""
        self._kind = "raw"  # of the current body: "reasoning", "answer" or "raw"

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._state == _BODY:
            self._body(self._buf, "", out)
        else:
            emit(out, self._buf)
        self._buf = ""
        return out

    def _step(self, out: list[Piece]) -> bool:
        if self._state == _PLAIN:
            emit(out, self._buf)
            self._buf = ""
            return False
        if self._state == _HEADER:
            return self._read_header()
        cut = min(((j, t) for t in TERMINATORS if (j := self._buf.find(t)) >= 0),
                  default=None)
        if cut is not None:
            j, term = cut
            self._body(self._buf[:j], term, out)
            self._state, self._buf = _HEADER, self._buf[j + len(term):]
            return True
        hold = partial_suffix(self._buf, TERMINATORS)
        self._body(self._buf[: len(self._buf) - hold], None, out)
        self._buf = self._buf[len(self._buf) - hold:]
        return False

    def _read_header(self) -> bool:
        head = self._buf.lstrip()
        if head and not any(o.startswith(head[:len(o)]) for o in _OPENERS):
            self._state = _PLAIN  # not harmony: pass it through
            return True
        j = self._buf.find(MESSAGE)
        if j < 0:
            if len(self._buf) > _MAX_HEADER:
                self._state = _PLAIN
                return True
            return False
        self._header, self._buf = self._buf[: j + len(MESSAGE)], self._buf[j + len(MESSAGE):]
        channel = _CHANNEL.search(self._header)
        name = channel.group(1) if channel else ""
        if _RECIPIENT.search(self._header):
            self._kind = "raw"
        elif name == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "answer"
        self._state = _BODY
        return True

    def _body(self, text: str, term: str | None, out: list[Piece]) -> None:
        """Emit a body piece; ``term`` the terminator when it ended ("" at the end of the
        output, None while it continues)."""
        if self._kind == "reasoning":
            emit(out, Reasoning(text))
        elif self._kind == "answer":
            emit(out, text)
        else:  # a call: its header once, then its body, then its terminator
            emit(out, self._header + text + (term or ""))
            self._header = ""


def fit_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gpt-oss's template refuses an assistant turn with tool calls that has both text
    and reasoning (harmony keeps one analysis message before a call; the text was a
    commentary preamble): the text joins the reasoning, where the template puts it."""
    out = []
    for m in messages:
        if m.get("tool_calls") and m.get("content") and m.get("thinking"):
            joined = f"{m['thinking']}\n\n{m['content']}"
            m = {**m, "content": "", "thinking": joined, "reasoning_content": joined}
        out.append(m)
    return out
