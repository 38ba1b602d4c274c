"""Forced tool calls: a grammar of the offered tools' schemas in the model family's own
tool-call markup, which the family's parser (``router.output.tool_parsers``) then reads.

``tool_choice: "required"`` (OpenAI, Responses), ``any`` (Anthropic) and a named tool
(``{"type": "function", "function": {"name": ..}}``, Anthropic ``{"type": "tool"}``) are
enforced by decoding under this grammar, on every engine (``workers.protocol.Constraint``
of kind ``grammar``). It is a Lark grammar in llguidance's dialect: each call's arguments
are ``%json {the tool's parameters schema}``, and a marker that is one token of the model's
tokenizer is written as that token (``<[id]>``), so the engine emits the token its parser
looks for. The grammar ends with the last call: the engine then allows only EOS.

Families whose calls carry JSON arguments are covered (``FORMATS``); the XML-style
families (Qwen3-Coder, GLM-4.5, MiniMax-M2, DeepSeek-V3.2) and gpt-oss's harmony channels
are not yet, and a forced tool choice on them is a 400 naming ``tool_choice``
(``ForcedCallsUnsupported``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Marker = Callable[[str], str]  # marker text → a Lark item matching it


@dataclass(frozen=True, slots=True)
class CallFormat:
    """One family's markup: ``open`` + calls joined by ``sep`` + ``close``; each call is
    ``call`` with ``{name}``/``{index}`` filled in and ``{args}`` the arguments' JSON."""

    open: tuple[str, ...]  # pieces: markers (an added token each) or text
    call: tuple[str, ...]  # pieces; "{args}" is the arguments, "{name}" the tool's name
    sep: tuple[str, ...] = ()
    close: tuple[str, ...] = ()


_H = CallFormat(("<tool_call>", "\n"), ('{"name": "{name}", "arguments": ', "{args}", "}"),
                sep=("\n", "</tool_call>", "\n", "<tool_call>", "\n"),
                close=("\n", "</tool_call>"))
FORMATS: dict[str, CallFormat] = {
    "hermes": _H,
    "llama3-json": CallFormat((), ('{"name": "{name}", "parameters": ', "{args}", "}"),
                              sep=("; ",)),
    "mistral": CallFormat((), ("[TOOL_CALLS]", "{name}", "[ARGS]", "{args}")),
    "deepseek-v3.1": CallFormat(
        ("<｜tool▁calls▁begin｜>",),
        ("<｜tool▁call▁begin｜>", "{name}", "<｜tool▁sep｜>", "{args}", "<｜tool▁call▁end｜>"),
        close=("<｜tool▁calls▁end｜>",)),
    "kimi-k2": CallFormat(
        ("<|tool_calls_section_begin|>",),
        ("<|tool_call_begin|>", "functions.{name}:{index}", "<|tool_call_argument_begin|>",
         "{args}", "<|tool_call_end|>"),
        close=("<|tool_calls_section_end|>",)),
}
MAX_CALLS = 8  # a "required" choice's calls, at most (each a whole call)
# Arguments as compact JSON, as the engines keep JSON output (llguidance's options, which
# vLLM's guidance backend reads too): no free whitespace a model could pad forever.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ForcedCallsUnsupported(ValueError):
    """The model's tool-call family has no forced-call grammar here."""


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def marker_item(added_id: Callable[[str], int | None]) -> Marker:
    """Text → ``<[id]>`` if it is one of the tokenizer's added tokens (``added_id``), else
    a string literal: an engine's grammar matches a special token by its id only."""
    def item(text: str) -> str:
        tid = added_id(text)
        return f"<[{tid}]>" if tid is not None else _lit(text)
    return item


def _object_schema(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tool's parameters as a schema of an object (none given: any object)."""
    schema = dict(params or {})
    if "type" not in schema and ("properties" in schema or not schema):
        schema["type"] = "object"
    schema.setdefault("x-guidance", JSON_STYLE)
    return schema


def _call_rule(fmt: CallFormat, name: str, index: int, marker: Marker) -> str:
    """One tool's call; a ``{name}``/``{index}`` piece is text (every call's index is 0,
    which the parsers accept)."""
    return " ".join(f"args_{index}" if piece == "{args}"
                    else marker(piece.replace("{name}", name).replace("{index}", "0"))
                    for piece in fmt.call)


def forced_calls(family: str | None, tools: Mapping[str, Mapping[str, Any]],
                 names: Sequence[str], added_id: Callable[[str], int | None],
                 parallel: bool = True, first: str | None = None) -> str:
    """The Lark grammar of one call of any of ``names`` (a named choice: one name), or of
    one to ``MAX_CALLS`` calls when ``parallel`` (a ``required`` choice). ``tools``: name →
    parameters schema. ``first``: a marker written before the calls (the closer of a
    reasoning block the prompt opened). ``ForcedCallsUnsupported`` for a family without a
    format."""
    fmt = FORMATS.get(family or "")
    if fmt is None:
        raise ForcedCallsUnsupported(
            f"forced tool calls are not supported for this model's tool-call format "
            f"({family or 'none detected'}); supported: {', '.join(sorted(FORMATS))}")
    marker = marker_item(added_id)
    rules = []
    for i, name in enumerate(names):
        rules.append(f"call_{i}: {_call_rule(fmt, name, i, marker)}")
        schema = json.dumps(_object_schema(tools.get(name)), ensure_ascii=False)
        rules.append(f"args_{i}: %json {schema}")
    calls = " | ".join(f"call_{i}" for i in range(len(names)))
    sep = " ".join(marker(p) for p in fmt.sep)
    more = f" ({sep} call){{0,{MAX_CALLS - 1}}}" if parallel else ""
    opening = " ".join(marker(p) for p in ((first,) if first else ()) + fmt.open)
    closing = " ".join(marker(p) for p in fmt.close)
    start = " ".join(x for x in (opening, "call" + more, closing) if x)
    return "\n".join([f"start: {start}", f"call: {calls}", *rules]) + "\n"


def after_marker(constraint_json: str | None, first: str,
                 added_id: Callable[[str], int | None]) -> str:
    """The grammar of ``first`` (a marker) then JSON valid against the schema
    ``constraint_json`` (None: any object), compact as the engines write it."""
    schema = json.loads(constraint_json) if constraint_json else {"type": "object"}
    if isinstance(schema, dict):
        schema.setdefault("x-guidance", JSON_STYLE)
    body = json.dumps(schema, ensure_ascii=False)
    return f"start: {marker_item(added_id)(first)} body\nbody: %json {body}\n"
