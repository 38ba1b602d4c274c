"""``mistral``: ``[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`` (tokenizer v3-v7,
Mistral 7B v0.3 to Small 3.1) or ``[TOOL_CALLS]name[ARGS]{..}`` per call (v11+,
Devstral, Magistral), ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{..}`` (Mistral Small 3.2);
the section runs to the end of the output. Mistral's newer templates accept only
9-character tool-call ids; ``router.prompt.tool_ids`` fits a conversation's ids to them
before templating.
"""

from __future__ import annotations

from router.output.tool_parsers.base import Family, Schemas, ToolCall, call_from, decode_json_calls


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
