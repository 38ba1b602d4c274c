"""Tool-call parsing per model family, streaming-safe.

Each model family writes tool calls its own way; the model's chat template says
which (it teaches the model the format). A ``Family`` names the markers that
open (and, for some, close) a tool call and the decoder of what lies between.
Families are registered by name in ``FAMILIES``; ``detect_family`` picks one
from the chat template's source.

- ``hermes``: ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``; detected by
  ``<tool_call>`` in the template (Qwen2.5, Qwen3 instruct, Hermes, the tiny model).
- ``mistral``: ``[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`` (v3) or
  ``[TOOL_CALLS]name[ARGS]{..}`` (v11); detected by ``[TOOL_CALLS]``.
- ``llama3_json``: ``<|python_tag|>{"name": .., "parameters": {..}}``, or an output
  that is one such JSON object; detected by ``<|python_tag|>`` (or ``"parameters"``
  with ``ipython``).

``MarkerParser`` is incremental: ``feed(text)`` returns the events that are safe
to emit now, ``flush()`` the rest at the end of the generation. Events are
either text (``str``) or a complete ``ToolCall``. Text before a tool call
streams as it arrives, except a tail that could be the start of a marker (held
until known) and trailing whitespace (dropped if a tool call follows, so that
``"I'll look.\\n<tool_call>"`` gives the text ``"I'll look."``). A tool call is
emitted whole once its closing marker (or the end of the output) is seen. A
call whose payload does not decode is given back as text, unchanged: nothing
the model wrote is lost.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from router.tokenization import resolve_model_dir
from workers.protocol import Chunk, WorkerMessage

ToolCallDecoder = Callable[[str], "list[ToolCall] | None"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


Event = str | ToolCall


def _call_from(obj: Any) -> ToolCall | None:
    """``{"name": .., "arguments"|"parameters": {..} or a JSON string}`` → ``ToolCall``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if isinstance(obj.get("function"), dict):  # {"function": {"name", "arguments"}} variants
        return _call_from(obj["function"])
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def decode_json_calls(payload: str) -> list[ToolCall] | None:
    """One or more JSON objects or arrays, separated by whitespace, ``;`` or ``,``."""
    decoder, text, pos, calls = json.JSONDecoder(), payload.strip(), 0, []
    while pos < len(text):
        if text[pos] in " \t\r\n;,":
            pos += 1
            continue
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        for item in obj if isinstance(obj, list) else [obj]:
            call = _call_from(item)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def decode_mistral_calls(payload: str) -> list[ToolCall] | None:
    """Mistral: a JSON list (v3) or ``name[ARGS]{..}`` pieces split by ``[TOOL_CALLS]`` (v11)."""
    calls: list[ToolCall] = []
    for piece in payload.split("[TOOL_CALLS]"):
        if not piece.strip():
            continue
        found: list[ToolCall] | None = None
        if "[ARGS]" in piece and not piece.lstrip().startswith(("[", "{")):
            name, _, args = piece.partition("[ARGS]")
            call = _call_from({"name": name.strip(), "arguments": args.strip() or "{}"})
            found = [call] if call else None
        else:
            found = decode_json_calls(piece)
        if not found:
            return None
        calls.extend(found)
    return calls or None


@dataclass(frozen=True, slots=True)
class Family:
    """How one model family writes tool calls."""

    name: str
    start: str
    end: str | None  # None: the call runs to the end of the output
    decode: ToolCallDecoder
    detect: tuple[str, ...]  # all of these in the chat template → this family
    bare_json: bool = False  # an output that starts with "{" is a call too

    def parser(self) -> MarkerParser:
        return MarkerParser(self)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


register(Family("hermes", "<tool_call>", "</tool_call>", decode_json_calls, ("<tool_call>",)))
register(Family("mistral", "[TOOL_CALLS]", None, decode_mistral_calls, ("[TOOL_CALLS]",)))
register(Family("llama3_json", "<|python_tag|>", None, decode_json_calls,
                ("<|python_tag|>",), bare_json=True))


def detect_family(template: str | None) -> str | None:
    """The registered family whose markers the chat template mentions (first match)."""
    if not template:
        return None
    for family in FAMILIES.values():
        if all(s in template for s in family.detect):
            return family.name
    if '"parameters"' in template and "ipython" in template:  # Llama 3.x without python_tag
        return "llama3_json"
    return None


def _partial_suffix(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


class MarkerParser:
    """Incremental parser for one family (see the module docstring)."""

    def __init__(self, family: Family) -> None:
        self._f = family
        self._buf = ""
        self._inside = False
        self._opener = ""  # space + marker that opened the current call ("" for bare JSON)
        self._started = False  # any non-whitespace output seen
        self._calls = 0
        self._after_call = False  # the next text follows a call: strip its leading space

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Event]) -> bool:
        """Consume what can be decided now; True if there may be more."""
        f = self._f
        if self._inside:
            if f.end is None or (j := self._buf.find(f.end)) < 0:
                return False
            payload, self._buf = self._buf[:j], self._buf[j + len(f.end):]
            self._close(payload, out, closed=True)
            return True
        if f.bare_json and not self._started:
            head = self._buf.lstrip()
            if not head:
                return False
            if head.startswith("{"):
                self._inside, self._opener, self._buf = True, "", head
                return True
            self._started = True
        if (i := self._buf.find(f.start)) >= 0:
            before = self._buf[:i]
            self._text(before, out, trim_end=True)
            self._inside, self._opener = True, before[len(before.rstrip()):] + f.start
            self._buf = self._buf[i + len(f.start):]
            return True
        keep = _partial_suffix(self._buf, f.start)
        safe = self._buf[: len(self._buf) - keep]
        body = safe.rstrip()  # trailing space waits: dropped if a call follows
        self._text(body, out, trim_end=False)
        self._buf = self._buf[len(body):]
        return False

    def flush(self) -> list[Event]:
        out: list[Event] = []
        if self._inside:
            self._close(self._buf, out, closed=False)
        else:
            self._text(self._buf, out, trim_end=self._calls > 0)
        self._buf = ""
        return out

    def _text(self, text: str, out: list[Event], trim_end: bool) -> None:
        if self._after_call:
            text = text.lstrip()
        if trim_end:
            text = text.rstrip()
        if text:
            self._started, self._after_call = True, False
            out.append(text)

    def _close(self, payload: str, out: list[Event], closed: bool) -> None:
        self._inside = False
        calls = self._f.decode(payload)
        if calls:
            out.extend(calls)
            self._calls += len(calls)
            self._started, self._after_call = True, True
            return
        # Not a call after all: give the model's text back unchanged.
        self._started, self._after_call = True, False
        out.append(self._opener + payload + ((self._f.end or "") if closed else ""))


def make_parser(family: str | None) -> MarkerParser | None:
    return FAMILIES[family].parser() if family in FAMILIES else None


def template_source(model_path: str) -> str | None:
    """The chat template text of a model folder, found as ``ChatTokenizer`` finds it."""
    folder = resolve_model_dir(model_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: tools may live in "tool_use"
        template = "\n".join(str(t.get("template", "")) for t in template)
    if not template and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    return template or None


@functools.lru_cache(maxsize=64)
def family_for_model(model_path: str) -> str | None:
    """The tool-call family of a model, detected once from its chat template."""
    try:
        return detect_family(template_source(model_path))
    except (OSError, ValueError):
        return None


async def events(
    messages: AsyncIterator[WorkerMessage], parser: MarkerParser | None
) -> AsyncIterator[Event]:
    """Worker messages → text and tool-call events (text passes through without a parser)."""
    async for msg in messages:
        if isinstance(msg, Chunk) and (text := msg.text):
            for ev in parser.feed(text) if parser else (text,):
                yield ev
    if parser is not None:
        for ev in parser.flush():
            yield ev
