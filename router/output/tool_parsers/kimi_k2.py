"""``kimi-k2``: ``<|tool_calls_section_begin|>`` around calls written
``<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{..}<|tool_call_end|>``
(Kimi-K2 Instruct and Thinking); the id is ``functions.`` + name + ``:`` + a counter.
"""

from __future__ import annotations

import re

from router.output.tool_parsers.base import Family, Schemas, ToolCall, json_object

_CALL = re.compile(r"<\|tool_call_begin\|>\s*(\S+?)\s*<\|tool_call_argument_begin\|>(.*?)"
                   r"<\|tool_call_end\|>", re.S)
_ID = re.compile(r"(?:functions\.)?(.+?):\d+")


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    if _CALL.sub("", payload).strip():
        return None
    calls: list[ToolCall] = []
    for m in _CALL.finditer(payload):
        ident, args = _ID.fullmatch(m.group(1)), json_object(m.group(2))
        if ident is None or args is None:
            return None
        calls.append(ToolCall(ident.group(1), args))
    return calls or None


FAMILY = Family("kimi-k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                decode, ("<|tool_calls_section_begin|>",))
