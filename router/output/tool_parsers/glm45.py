"""``glm-4.5``: ``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>...
</tool_call>``, one call per block (GLM-4.5, 4.6, 4.7); values typed by the tool's schema
(the template writes non-strings as JSON). Its template also mentions ``<tool_call>``:
``<arg_key>`` tells it from hermes.
"""

from __future__ import annotations

import re
from typing import Any

from router.output.tool_parsers.base import Family, Schemas, ToolCall, param_schema, typed_value

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_NAME = re.compile(r"[^\s<>]+")


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    head, mark, rest = payload.partition("<arg_key>")
    name = head.strip()
    body = mark + rest
    if not _NAME.fullmatch(name) or _PAIR.sub("", body).strip():
        return None
    args: dict[str, Any] = {}
    for m in _PAIR.finditer(body):
        key = m.group(1).strip()
        args[key] = typed_value(m.group(2), param_schema(schemas, name, key))
    return [ToolCall(name, args)]


FAMILY = Family("glm-4.5", "<tool_call>", "</tool_call>", decode, ("<tool_call>", "<arg_key>"))
