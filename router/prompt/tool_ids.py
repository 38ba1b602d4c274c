"""Tool-call ids as a template accepts them. Mistral's newer templates (Mistral Small 3.x,
Magistral) raise on any id but 9 letters and digits, and clients send any; the ids are
mapped before templating, the same way on every turn, so the prompt stays prefix-stable.
"""

from __future__ import annotations

import hashlib
from typing import Any

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
