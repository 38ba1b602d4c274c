"""``deepseek-v3.1``: ``<｜tool▁calls▁begin｜>`` around calls written
``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>`` (DeepSeek-V3.1,
V3.2-Exp), or V3/R1's ``function<｜tool▁sep｜>name\\n```json\\n{..}\\n``` `` form.
"""

from __future__ import annotations

import re

from router.output.tool_parsers.base import Family, Schemas, ToolCall, json_object

_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)
_V3 = re.compile(r"([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.S)  # after "function"


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    if _CALL.sub("", payload).strip():
        return None
    calls: list[ToolCall] = []
    for m in _CALL.finditer(payload):
        name, args_text = m.group(1).strip(), m.group(2)
        if name == "function" and (v3 := _V3.fullmatch(args_text)):
            name, args_text = v3.group(1).strip(), v3.group(2)
        args = json_object(args_text)
        if not name or args is None:
            return None
        calls.append(ToolCall(name, args))
    return calls or None


FAMILY = Family("deepseek-v3.1", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", decode,
                ("<｜tool▁calls▁begin｜>",))
