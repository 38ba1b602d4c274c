"""What the XML-style families share: ``<invoke name="f"><parameter name="p">v</parameter>``
blocks (MiniMax-M2; DeepSeek-V3.2's DSML with a ``｜DSML｜`` prefix on every tag), and
values written as text, typed by the tool's JSON schema (``base.typed_value``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from router.output.tool_parsers.base import Schemas, ToolCall, param_schema, typed_value


def trim_newlines(raw: str) -> str:
    """The value between a tag and its close, without the one newline on each side
    the templates put there (other whitespace is the model's)."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def decode_invokes(payload: str, schemas: Schemas, prefix: str = "") -> list[ToolCall] | None:
    """``<{prefix}invoke name="f">`` blocks, each with ``<{prefix}parameter name="p" ..>v``
    closes; None if anything but whitespace lies outside them (not a call after all)."""
    p = re.escape(prefix)
    invoke = re.compile(rf'<{p}invoke name="([^"]+)">(.*?)</{p}invoke>', re.S)
    param = re.compile(rf'<{p}parameter name="([^"]+)"([^>]*)>(.*?)</{p}parameter>', re.S)
    calls: list[ToolCall] = []
    if invoke.sub("", payload).strip():
        return None
    for m in invoke.finditer(payload):
        name, body = m.group(1).strip(), m.group(2)
        if param.sub("", body).strip():
            return None
        args: dict[str, Any] = {}
        for q in param.finditer(body):
            key, attrs, raw = q.group(1), q.group(2), trim_newlines(q.group(3))
            args[key] = _value(raw, attrs, param_schema(schemas, name, key))
        calls.append(ToolCall(name, args))
    return calls or None


def _value(raw: str, attrs: str, schema: Any) -> Any:
    if 'string="false"' in attrs and schema is None:  # DSML: JSON, says the model
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return typed_value(raw, schema)
