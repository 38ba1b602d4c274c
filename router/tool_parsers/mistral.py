"""``mistral``: ``[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`` (tokenizer v3-v7,
Mistral 7B v0.3 to Small 3.1) or ``[TOOL_CALLS]name[ARGS]{..}`` per call (v11+,
Devstral, Magistral), ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{..}`` (Mistral Small 3.2);
the section runs to the end of the output. Mistral's newer templates accept only
9-character tool-call ids; ``with_nine_char_ids`` fits a conversation's ids to them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from router.tool_parsers.base import Family, Schemas, ToolCall, call_from, decode_json_calls


def decode(payload: str, schemas: Schemas) -> list[ToolCall] | None:
    """A JSON list (v3) or ``name[ARGS]{..}`` pieces split by ``[TOOL_CALLS]`` (v11)."""
    calls: list[ToolCall] = []
    for piece in payload.split("[TOOL_CALLS]"):
        if not piece.strip():
            continue
        found: list[ToolCall] | None = None
        if "[ARGS]" in piece and not piece.lstrip().startswith(("[", "{")):
            name, _, args = piece.partition("[ARGS]")
            name = name.partition("[CALL_ID]")[0]  # Mistral Small 3.2 adds the call's id
            call = call_from({"name": name.strip(), "arguments": args.strip() or "{}"})
            found = [call] if call else None
        else:
            found = decode_json_calls(piece)
        if not found:
            return None
        calls.extend(found)
    return calls or None


FAMILY = Family("mistral", "[TOOL_CALLS]", None, decode, ("[TOOL_CALLS]",))

# What Mistral's templates (Mistral Small 3.x, Magistral) raise for any other id.
ID_RULE = "alphanumeric strings with length 9"
_BASE62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def nine_char_id(call_id: str) -> str:
    """A tool-call id as Mistral's templates accept it: kept if already 9 letters and
    digits, else derived from a hash of it (the same id maps the same way on every turn,
    so the conversation's prompt stays prefix-stable)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(_BASE62[(n // 62**i) % 62] for i in range(9))


def with_nine_char_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every tool-call id (assistant ``tool_calls[].id``, tool
    ``tool_call_id``) mapped by ``nine_char_id``; the input is left unchanged."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": nine_char_id(str(c["id"]))} if c.get("id")
                                     else c for c in m["tool_calls"]]}
        if m.get("tool_call_id"):
            m = {**m, "tool_call_id": nine_char_id(str(m["tool_call_id"]))}
        out.append(m)
    return out
