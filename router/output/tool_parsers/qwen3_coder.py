"""``qwen3-coder``: ``<tool_call><function=f><parameter=p>\\nv\\n</parameter></function>
</tool_call>`` (Qwen3-Coder, Qwen3-Next/3.5 instruct); values typed by the tool's JSON
schema (a declared string stays text; numbers, booleans, objects and arrays are parsed).
Its template also mentions hermes's ``<tool_call>``: ``<function=`` tells them apart.
The model sometimes leaves out the ``<tool_call>`` wrapper: a bare ``<function=..>``
block is a call too (as in vLLM's parser).
"""

from __future__ import annotations

import re
from typing import Any

from router.output.tool_parsers.base import Family, Schemas, ToolCall, param_schema, typed_value
from router.output.tool_parsers.xml_calls import trim_newlines

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    """The ``<function=..>`` blocks of one ``<tool_call>``; None if other text is there."""
    if _FUNCTION.sub("", payload).strip():
        return None
    calls: list[ToolCall] = []
    for m in _FUNCTION.finditer(payload):
        name, body = m.group(1).strip(), m.group(2)
        if _PARAMETER.sub("", body).strip():
            return None
        args: dict[str, Any] = {}
        for p in _PARAMETER.finditer(body):
            key = p.group(1).strip()
            args[key] = typed_value(trim_newlines(p.group(2)), param_schema(schemas, name, key))
        calls.append(ToolCall(name, args))
    return calls or None


FAMILY = Family("qwen3-coder", "<tool_call>", "</tool_call>", decode,
                ("<tool_call>", "<function=", "<parameter="),
                unwrapped=(("<function=", "</function>"),))
