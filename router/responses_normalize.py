"""A Responses request → the chat template's input, prefix-stable turn to turn.

Codex resends the whole conversation as ``input`` items every turn (``store:
false``); with ``previous_response_id`` the stored conversation comes first.
Either way the rendered prompt of turn N+1 must start with turn N's, so:

- ``instructions`` is the system prompt, with volatile ``x-anthropic-…`` header
  lines stripped as on the other APIs; ``developer`` and ``system`` messages are
  system messages (``router.normalize.place_system`` merges the leading ones and
  keeps later ones where the template can render them);
- ``reasoning`` items are dropped (their encrypted content is request-specific,
  and kvroute's models do not reason aloud);
- ``function_call`` items join the assistant message before them as its
  ``tool_calls`` (arguments as mappings, as templates expect), and each
  ``function_call_output`` is a ``role: "tool"`` message naming its call;
- ``custom`` (freeform) tools are offered as functions of one string parameter,
  ``input``, and their calls and outputs map the same way.

Refused with a 400 naming the field: images, files and audio (text-only models),
an output whose ``call_id`` matches no earlier call, hosted tools kvroute cannot
run (web search, file search, ...).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from router.errors import ApiError
from router.normalize import ChatPrompt, place_system, strip_volatile
from router.responses_schema import (
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FilePart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    ImagePart,
    MessageItem,
    Part,
    RefusalPart,
    ResponsesRequest,
    TextPart,
)

CUSTOM_INPUT = "input"  # the one parameter a freeform tool is offered with


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]], system_in_place: bool
            ) -> tuple[ChatPrompt, list[dict[str, Any]]]:
    """(the template's input, the conversation to store: history + this input, no system
    prompt). ``history`` is the stored conversation of ``previous_response_id``."""
    conversation = [dict(m) for m in history]
    calls = {c["id"]: c["function"]["name"] for m in conversation
             for c in m.get("tool_calls", ())}
    for i, item in enumerate(req.items()):
        _append(conversation, item, f"input.{i}", calls)
    messages = list(conversation)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": strip_volatile(req.instructions)})
    if req.text and req.text.format and (note := req.text.format.as_response_format()
                                         .instruction()):
        messages.insert(0, {"role": "system", "content": note})
    return ChatPrompt(place_system(messages, system_in_place), template_tools(req)), conversation


def template_tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if isinstance(tool, FunctionTool):
            fn: dict[str, Any] = {"name": tool.name}
            if tool.description:
                fn["description"] = tool.description
            fn["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        elif isinstance(tool, CustomTool):
            fn = {"name": tool.name, "description": _custom_description(tool),
                  "parameters": {"type": "object", "required": [CUSTOM_INPUT],
                                 "properties": {CUSTOM_INPUT: {"type": "string"}}}}
        else:
            raise ApiError(400, f"tools.{i}: hosted tool {tool.type!r} is not supported: "
                           "kvroute serves function and custom tools, which the client runs",
                           "unsupported_tool", f"tools.{i}.type")
        out.append({"type": "function", "function": fn})
    return out


def custom_tool_names(req: ResponsesRequest) -> frozenset[str]:
    return frozenset(t.name for t in req.tools or () if isinstance(t, CustomTool))


def _custom_description(tool: CustomTool) -> str:
    text = tool.description or ""
    fmt = tool.format or {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        text += (f"\n\nWrite `{CUSTOM_INPUT}` in this {fmt.get('syntax', 'grammar')} "
                 f"grammar:\n{fmt['definition']}")
    return text.strip()


def _append(conv: list[dict[str, Any]], item: Any, where: str, calls: dict[str, str]) -> None:
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        conv.append({"role": role, "content": _text(item.content, f"{where}.content")})
    elif isinstance(item, FunctionCallItem | CustomToolCallItem):
        _call(conv, item)
        calls[item.call_id] = item.name
    elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
        if item.call_id not in calls:
            raise ApiError(400, f"{where}.call_id: no function_call with call_id "
                           f"{item.call_id!r} comes before this output",
                           "invalid_request", f"{where}.call_id")
        conv.append({"role": "tool", "tool_call_id": item.call_id, "name": calls[item.call_id],
                     "content": _text(item.output, f"{where}.output")})
    # reasoning: dropped (see the module docstring)


def _call(conv: list[dict[str, Any]], item: FunctionCallItem | CustomToolCallItem) -> None:
    if isinstance(item, CustomToolCallItem):
        args: Any = {CUSTOM_INPUT: item.input}
    else:
        args = item.arguments
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(item.arguments)
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": args}}
    if conv and conv[-1]["role"] == "assistant":  # the text before the call, or earlier calls
        conv[-1].setdefault("tool_calls", []).append(call)
    else:
        conv.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart | FilePart):
            raise ApiError(400, f"{where}.{j}: {part.type} parts are not supported: kvroute "
                           "serves text-only models", "unsupported_content", f"{where}.{j}")
        texts.append(part.text if isinstance(part, TextPart) else
                     part.refusal if isinstance(part, RefusalPart) else "")
    return "".join(texts)
