"""``gpt-oss``: harmony messages; a message with a recipient is a tool call::

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

Each message's header and body are parsed by ``openai_harmony`` (the maintained
harmony library; the ``oss-harmony`` build ships the o200k vocabulary inside its
wheel, so it works offline, unlike ``openai-harmony`` 0.0.8, which downloads it on
first use). This module only splits the text stream into messages: a header runs
from ``<|start|>`` or ``<|channel|>`` to ``<|message|>``, a body to ``<|end|>``,
``<|call|>`` or ``<|return|>`` (or the end of the output: engines stop on
``<|call|>`` and may leave it out). A body without a recipient streams as text (the
reasoning parser, run first, has already taken the ``analysis`` channel, and with no
reasoning parser the model's words are still not lost); a body with one is held until
it ends and becomes a ``ToolCall`` (``functions.`` stripped from the name). A header or
call harmony cannot parse is given back as text, unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from openai_harmony import HarmonyEncodingName, HarmonyError, Role, load_harmony_encoding

from router.output.text_stream import Buffered, partial_suffix
from router.output.tool_parsers.base import Event, Family, Schemas, ToolCall, json_object

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
_OPENERS = (START, CHANNEL)
_MAX_HEADER = 512  # longer than any header: not harmony markup after all


@functools.cache
def _encoding() -> Any:
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def parse_message(text: str) -> Any | None:
    """One assistant message's text → harmony's ``Message`` (None: not one)."""
    if text.startswith(START):  # "<|start|>assistant": the role is known, harmony wants it gone
        text = text[len(START):].removeprefix("assistant")
    enc = _encoding()
    try:
        msgs = enc.parse_messages_from_completion_tokens(
            enc.encode(text, allowed_special="all"), Role.ASSISTANT)
    except HarmonyError:
        return None
    return msgs[0] if len(msgs) == 1 else None


def _earliest(buf: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    return min(((i, m) for m in markers if (i := buf.find(m)) >= 0), default=None)


class HarmonyParser(Buffered[Event]):
    """Incremental harmony splitter (see the module docstring)."""

    def __init__(self, family: Family, schemas: Schemas) -> None:
        del family, schemas  # arguments are JSON in harmony: no schema needed
        self._buf, self._header = "", ""
        self._state = "text"  # "text" | "header" | "body" | "call"

    def flush(self) -> list[Event]:
        out: list[Event] = []
        if self._state == "call":
            self._call(self._buf, "", out)
        elif self._buf or self._state == "header":
            _text(out, (self._header if self._state == "header" else "") + self._buf)
        self._buf, self._header, self._state = "", "", "text"
        return out

    def _step(self, out: list[Event]) -> bool:
        if self._state == "header":
            return self._read_header(out)
        markers = _OPENERS if self._state == "text" else TERMINATORS
        found = _earliest(self._buf, markers)
        if found is None:
            keep = partial_suffix(self._buf, markers)
            if self._state != "call":
                _text(out, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
            return False
        i, marker = found
        head, self._buf = self._buf[:i], self._buf[i + len(marker):]
        if self._state == "text":
            _text(out, head)
            self._state, self._header = "header", marker
        elif self._state == "body":
            _text(out, head)
            self._state = "text"
        else:
            self._call(head, marker, out)
        return True

    def _read_header(self, out: list[Event]) -> bool:
        j = self._buf.find(MESSAGE)
        if j < 0:
            if len(self._header) + len(self._buf) > _MAX_HEADER:
                _text(out, self._header + self._buf)
                self._buf, self._state = "", "text"
            return False
        self._header += self._buf[: j + len(MESSAGE)]
        self._buf = self._buf[j + len(MESSAGE):]
        msg = parse_message(self._header)
        if msg is None:
            _text(out, self._header)
            self._state = "text"
        else:
            self._state = "call" if msg.recipient else "body"
        return True

    def _call(self, body: str, terminator: str, out: list[Event]) -> None:
        msg = parse_message(self._header + body + terminator)
        args = json_object(msg.content[0].text if msg and msg.content else "") if msg else None
        if msg is None or args is None or not msg.recipient:
            _text(out, self._header + body + terminator)  # not a call: the model's text back
        else:
            out.append(ToolCall(msg.recipient.removeprefix("functions."), args))
        self._state, self._header = "text", ""


def _text(out: list[Event], text: str) -> None:
    if not text:
        return
    if out and isinstance(out[-1], str):
        out[-1] += text
    else:
        out.append(text)


def _no_decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    return None  # HarmonyParser decodes messages itself


FAMILY = Family("gpt-oss", CHANNEL, None, _no_decode, ("<|channel|>", "<|call|>"),
                factory=HarmonyParser)
