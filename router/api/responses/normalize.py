"""A Responses request → the chat template's input, prefix-stable turn to turn.

Codex resends the whole conversation as ``input`` items every turn (``store:
false``); with ``previous_response_id`` the stored conversation comes first.
Either way the rendered prompt of turn N+1 must start with turn N's, so:

- ``instructions`` is the system prompt, with volatile ``x-anthropic-…`` header
  lines stripped as on the other APIs; ``developer`` and ``system`` messages are
  system messages (``router.api.anthropic.normalize.place_system`` merges the leading ones and
  keeps later ones where the template can render them);
- tools (``router.api.responses.tools``): the request's ``tools``, then those of
  ``additional_tools`` items that come before the conversation starts, form the
  template's tool list, in that order on every turn; tools that arrive later
  (``additional_tools`` mid-conversation, a client ``tool_search_output``) are
  rendered where they arrive, as text, so the prefix before them never moves;
- ``reasoning`` items are the past reasoning (``reasoning_content``) of the assistant
  message that follows them, which the model's template renders as it does its own
  (``encrypted_content`` is ignored: one with no text, as OpenAI's models send, is
  dropped); ``reasoning.effort`` goes to thinking templates;
- calls (``function_call``, ``custom_tool_call``, ``tool_search_call``) join the
  assistant message before them as its ``tool_calls`` (arguments as mappings, as
  templates expect), and each output is a ``role: "tool"`` message naming its call.

- Codex's sub-agent items: an ``agent_message`` is a user message, its text after a
  line naming its author and recipient; its ``encrypted_content`` parts are the text a
  kvroute model wrote (a sub-agent's task), or dropped when sealed for OpenAI's servers
  (kvroute cannot read them), as reasoning's are. A
  ``local_shell_call`` is a call of ``local_shell``. ``compaction`` /
  ``compaction_summary`` (a sealed summary), ``ghost_snapshot`` and ``web_search_call``
  have nothing to render and are dropped, so the rest renders the same on every turn.

Bounded before rendering (``router.api.common.limits.Expansion``): a stored conversation's
size against the text a prompt may hold, its messages with the new ones against the
message cap, and every function a namespace or an ``additional_tools`` item holds against
the tool cap.

Refused with a 400 naming the field: images, files and audio (text-only models), an
output whose ``call_id`` matches no earlier call, hosted tools kvroute cannot run.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from router.api.common.limits import MAX_TEXT_CHARS, Expansion, check_messages
from router.api.responses.schema import (
    AdditionalToolsItem,
    AgentMessageItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FilePart,
    FunctionCallItem,
    FunctionCallOutputItem,
    ImagePart,
    LocalShellCallItem,
    MessageItem,
    Part,
    ReasoningItem,
    RefusalPart,
    ResponsesRequest,
    TextPart,
    Tool,
    ToolSearchCallItem,
    ToolSearchOutputItem,
)
from router.api.responses.tools import CUSTOM_INPUT, TOOL_SEARCH, ToolCatalog, template_name
from router.errors import ApiError, clip
from router.output.reasoning_parsers.controls import options, with_past_reasoning
from router.prompt.template import ChatPrompt, place_system, strip_volatile

_TOOLS = TypeAdapter(list[Tool])
LOCAL_SHELL = "local_shell"  # OpenAI's hosted shell tool, as a call's name


@dataclass
class Conversation:
    """What a stored response keeps: template messages (no system prompt) and the raw
    tools that came with items (``listed``: in the tool list; ``loaded``: in place);
    ``chars``: its size as stored (all its text, reasoning included)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    listed: list[dict[str, Any]] = field(default_factory=list)
    loaded: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0


def to_chat(req: ResponsesRequest, history: Conversation, system_in_place: bool,
            max_chars: int = MAX_TEXT_CHARS) -> tuple[ChatPrompt, Conversation, ToolCatalog]:
    """(the template's input, the conversation to store, the tools as offered). The stored
    conversation counts against ``max_chars`` (the target's ``max_prompt_chars``) and, with
    the new items, against the message and tool caps, before anything is rendered."""
    room = Expansion(max_chars)
    room.add_chars(history.chars, "previous_response_id")
    items = req.items()
    check_messages(len(history.messages) + len(items), "input")
    conv = Conversation([dict(m) for m in history.messages], list(history.listed),
                        list(history.loaded))
    catalog = ToolCatalog(room=room)
    catalog.listed = catalog.add(req.tools or [], "tools")
    catalog.listed += catalog.add(_TOOLS.validate_python(conv.listed), "tools")
    catalog.add(_TOOLS.validate_python(conv.loaded), "tools")
    calls = {c["id"]: c["function"]["name"] for m in conv.messages
             for c in m.get("tool_calls", ())}
    for i, item in enumerate(items):
        _append(conv, catalog, item, f"input.{i}", calls)
    messages = list(conv.messages)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": strip_volatile(req.instructions)})
    prompt = ChatPrompt(place_system(messages, system_in_place), catalog.listed or None,
                        options=options(None, req.reasoning.effort if req.reasoning else None))
    return prompt, conv, catalog


def without_unrendered_reasoning(messages: list[dict[str, Any]], rendered: str
                                 ) -> list[dict[str, Any]]:
    """The conversation to store, less the past reasoning no continuation can render
    (``rendered``: ``ChatTokenizer.past_reasoning``): with "none" all of it, with
    "after_last_user" that of the turns before the last user message. Kept, it would be
    stored and re-sent turn after turn but never tokenized, so never charged."""
    if rendered == "all":
        return messages
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"),
                    default=-1) if rendered == "after_last_user" else len(messages)
    return [{k: v for k, v in m.items() if k not in _REASONING}
            if i < last_user and _REASONING & m.keys() else m for i, m in enumerate(messages)]


_REASONING = frozenset({"reasoning_content", "thinking"})


def _append(conv: Conversation, catalog: ToolCatalog, item: Any, where: str,
            calls: dict[str, str]) -> None:
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        text = _text(item.content, f"{where}.content")
        if role == "assistant" and _thinking_only(conv.messages):
            conv.messages[-1]["content"] = text  # the answer after its reasoning
        else:
            conv.messages.append({"role": role, "content": text})
    elif isinstance(item, AgentMessageItem):
        conv.messages.append({"role": "user", "content": _agent_text(item, where)})
    elif isinstance(item, LocalShellCallItem):
        calls[_call(conv, item, where)] = LOCAL_SHELL
    elif isinstance(item, ReasoningItem) and (thought := item.text()):
        if _thinking_only(conv.messages):  # several reasoning items in a row: one turn
            thought = f"{conv.messages.pop()['reasoning_content']}\n\n{thought}"
        conv.messages.append(with_past_reasoning({"role": "assistant", "content": ""}, thought))
    elif isinstance(item, AdditionalToolsItem):
        _more_tools(conv, catalog, item.tools, f"{where}.tools", None)
    elif isinstance(item, FunctionCallItem | CustomToolCallItem | ToolSearchCallItem):
        calls[_call(conv, item, where)] = _call_name(item)
    elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
        name = _called(calls, item.call_id, where)
        conv.messages.append({"role": "tool", "tool_call_id": item.call_id, "name": name,
                              "content": _text(item.output, f"{where}.output")})
    elif isinstance(item, ToolSearchOutputItem):
        call = _called(calls, item.call_id, where) if item.call_id else None
        _more_tools(conv, catalog, item.tools, f"{where}.tools", item.call_id if call else None)


def _thinking_only(messages: list[dict[str, Any]]) -> bool:
    """The last message is an assistant turn opened by a reasoning item alone."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and not last["content"] and \
        "tool_calls" not in last and "reasoning_content" in last


def _more_tools(conv: Conversation, catalog: ToolCatalog, tools: list[Any], where: str,
                call_id: str | None) -> None:
    """Tools arriving with an item: listed before the conversation starts, else in place
    (as the output of the search that loaded them, or as a system note)."""
    raw = [t.model_dump(by_alias=True, exclude_none=True) for t in tools]
    fns = catalog.add(tools, where)
    if call_id is None and not any(m["role"] != "system" for m in conv.messages):
        catalog.listed += fns
        conv.listed += raw
        return
    conv.loaded += raw
    text = "\n".join(json.dumps(f["function"], ensure_ascii=False) for f in fns)
    if call_id is not None:
        conv.messages.append({"role": "tool", "tool_call_id": call_id, "name": TOOL_SEARCH,
                              "content": text})
    elif fns:
        conv.messages.append({"role": "system",
                              "content": f"These tools can be called from now on:\n{text}"})


def _agent_text(item: AgentMessageItem, where: str) -> str:
    """The message's text after a line naming who sent it to whom (fixed words, so the
    same item renders the same on every turn); sealed parts are left out."""
    who = " ".join(x for x in (f"from {item.author}" if item.author else "",
                               f"to {item.recipient}" if item.recipient else "") if x)
    text = _text(item.content, f"{where}.content")
    return f"Message {who}:\n{text}" if who else text


def _call_name(item: FunctionCallItem | CustomToolCallItem | ToolSearchCallItem
               | LocalShellCallItem) -> str:
    if isinstance(item, ToolSearchCallItem):
        return TOOL_SEARCH
    if isinstance(item, LocalShellCallItem):
        return LOCAL_SHELL
    return template_name(item.name, item.namespace)


def _call(conv: Conversation, item: Any, where: str) -> str:
    if isinstance(item, CustomToolCallItem):
        args: Any = {CUSTOM_INPUT: item.input}
    elif isinstance(item, LocalShellCallItem):
        args = item.action
    elif isinstance(item, ToolSearchCallItem):
        args = item.arguments if isinstance(item.arguments, dict) else {}
    else:
        args = item.arguments
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(item.arguments)
    call_id = item.call_id or f"{where}.call"
    call = {"id": call_id, "type": "function",
            "function": {"name": _call_name(item), "arguments": args}}
    msgs = conv.messages
    if msgs and msgs[-1]["role"] == "assistant":  # the text before the call, or earlier calls
        msgs[-1].setdefault("tool_calls", []).append(call)
    else:
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
    return call_id


def _called(calls: dict[str, str], call_id: str, where: str) -> str:
    if call_id not in calls:
        raise ApiError(400, f"{where}.call_id: no call with call_id {clip(call_id)!r} comes before "
                       "this output", "invalid_request", f"{where}.call_id")
    return calls[call_id]


def _text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart | FilePart):
            raise ApiError(400, f"{where}.{j}: {part.type} parts are not supported: kvroute "
                           "serves text-only models", "unsupported_content", f"{where}.{j}")
        texts.append(part.text if isinstance(part, TextPart) else
                     part.refusal if isinstance(part, RefusalPart) else part.text())
    return "".join(texts)
