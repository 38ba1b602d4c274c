"""The incremental tool-call parser interface, and the marker parser most families use.

A ``ToolParser`` is fed the model's output as it arrives: ``feed(text)`` returns the
events that are safe to emit now, ``flush()`` the rest at the end of the generation.
Events are text (``str``) or a complete ``ToolCall``; markup never reaches the text.

``Family`` describes the common case, a tool-call section between a start marker
and an end marker (or the end of the output), decoded as a whole by the family's
``decode``; ``MarkerParser`` runs it. Text before a section streams as it arrives,
except a tail that could be the start of a marker (held until known) and trailing
whitespace (dropped if a call follows, so ``"I'll look.\\n<tool_call>"`` gives
``"I'll look."``). A section whose payload does not decode is given back as text,
unchanged: nothing the model wrote is lost. Families whose output is not one
section (gpt-oss's harmony channels) bring their own parser class (``factory``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.output.text_stream import Buffered, partial_suffix

# Tool name → the JSON schema of its parameters, as the request declared them.
Schemas = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


Event = str | ToolCall
ToolCallDecoder = Callable[[str, Schemas], "list[ToolCall] | None"]


class ToolParser(Protocol):
    def feed(self, text: str) -> list[Event]: ...

    def flush(self) -> list[Event]: ...


@dataclass(frozen=True, slots=True)
class Family:
    """How one model family writes tool calls, and how its template gives it away."""

    name: str  # stable kebab-case name (the model config's ``tool_parser``)
    start: str
    end: str | None  # None: the section runs to the end of the output
    decode: ToolCallDecoder
    detect: tuple[str, ...]  # all of these in the template or special tokens → this family
    bare_json: bool = False  # an output that starts with "{" is a section too
    # Sections the model may also write without the wrapper: (start, end), both kept in
    # the payload given to ``decode`` (Qwen3-Coder's bare ``<function=..>..</function>``).
    unwrapped: tuple[tuple[str, str], ...] = ()
    factory: Callable[[Family, Schemas], ToolParser] | None = field(default=None, repr=False)

    def parser(self, schemas: Schemas | None = None) -> ToolParser:
        return (self.factory or MarkerParser)(self, schemas or {})


def call_from(obj: Any) -> ToolCall | None:
    """``{"name": .., "arguments"|"parameters": {..} or a JSON string}`` → ``ToolCall``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if isinstance(obj.get("function"), dict):  # {"function": {"name", "arguments"}} variants
        return call_from(obj["function"])
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = json_object(args)
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def json_object(text: str) -> dict[str, Any] | None:
    """A JSON object's text (blank: ``{}``) → the object; anything else → None."""
    if not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def decode_json_calls(payload: str, schemas: Schemas | None = None) -> list[ToolCall] | None:
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
            call = call_from(item)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def _types(schema: Mapping[str, Any]) -> list[str]:
    """The non-null JSON types a schema allows (``type``, a type list, anyOf/oneOf)."""
    t = schema.get("type")
    found = [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)] if t else []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            if isinstance(sub, Mapping):
                found += _types(sub)
    return [x for x in found if x != "null"]


_ALIASES = {"int": "integer", "float": "number", "bool": "boolean", "dict": "object",
            "list": "array"}
_FITS: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    and float(v).is_integer(),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter written as text (the XML-style families) → the type its schema declares.

    Declared (or undeclared) strings stay the text as written; a number, boolean,
    object or array is parsed from it (``True``/``False`` too, as Python-trained models
    write them); text that does not parse to a declared type stays text, so the
    model's words are never lost.
    """
    types = [_ALIASES.get(t, t) for t in _types(schema or {})]
    if not types or "string" in types:
        return raw
    text = raw.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = {"True": True, "False": False, "None": None}.get(text, raw)
    if value is None:
        return None
    for t in types:
        if (fits := _FITS.get(t)) and fits(value):
            return int(value) if t == "integer" else value
    return raw


def param_schema(schemas: Schemas, tool: str, param: str) -> Mapping[str, Any] | None:
    props = (schemas.get(tool) or {}).get("properties")
    sub = props.get(param) if isinstance(props, Mapping) else None
    return sub if isinstance(sub, Mapping) else None


class MarkerParser(Buffered[Event]):
    """Incremental parser for one section-delimited family (see the module docstring)."""

    def __init__(self, family: Family, schemas: Schemas) -> None:
        self._f, self._schemas = family, schemas
        self._ends: dict[str, str | None] = {family.start: family.end, **dict(family.unwrapped)}
        self._end: str | None = family.end  # the end marker of the current section
        self._kept = ""  # an unwrapped section's start marker, part of its payload
        self._buf = ""
        self._inside = False
        self._opener = ""  # space + marker that opened the current call ("" for bare JSON)
        self._started = False  # any non-whitespace output seen
        self._calls = 0
        self._after_call = False  # the next text follows a call: strip its leading space
        self._markers = tuple(self._ends)
        firsts = sorted({m[0] for m in self._markers if m})  # where a marker can start
        self._may_start = re.compile("|".join(map(re.escape, firsts)) or "(?!)").search

    def feed(self, text: str) -> list[Event]:
        buf = self._buf + text
        if self._inside or (self._f.bare_json and not self._started) or self._may_start(buf):
            return super().feed(text)
        # Plain text, the bulk of a stream: no marker nor a marker's start can be in it, so
        # this is ``_step``'s text branch without the searches (tests/router/tool_parsers).
        body = buf.rstrip()  # trailing space waits: dropped if a call follows
        out: list[Event] = []
        self._text(body, out, trim_end=False)
        self._buf = buf[len(body):]
        return out

    def _step(self, out: list[Event]) -> bool:
        f = self._f
        if self._inside:
            if self._end is None or (j := self._buf.find(self._end)) < 0:
                return False
            payload, self._buf = self._buf[:j], self._buf[j + len(self._end):]
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
        found = min(((i, m) for m in self._ends if (i := self._buf.find(m)) >= 0), default=None)
        if found is not None:
            i, start = found
            before = self._buf[:i]
            self._text(before, out, trim_end=True)
            self._inside, self._opener = True, before[len(before.rstrip()):] + start
            self._end, self._kept = self._ends[start], "" if start == f.start else start
            self._buf = self._buf[i + len(start):]
            return True
        keep = partial_suffix(self._buf, self._markers)
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
        whole = self._kept + payload + ((self._end or "") if self._kept and closed else "")
        calls = self._f.decode(whole, self._schemas)
        if calls:
            out.extend(calls)
            self._calls += len(calls)
            self._started, self._after_call = True, True
            return
        # Not a call after all: give the model's text back unchanged.
        self._started, self._after_call = True, False
        out.append(self._opener + payload + ((self._end or "") if closed else ""))
