"""Prefix-stable normalisation: an Anthropic conversation → the chat template's input.

kvroute's cache hits depend on turn N+1's prompt starting with the exact tokens
of turn N's. Agents resend the whole conversation each turn, but some parts of
what they send change on every request without changing its meaning; those
parts are dropped here, before templating, so the rendered prefix stays stable.

What is normalised (documented for users in docs/api.md):

1. Volatile system blocks are dropped: Claude Code (>= 2.1.36) sends as its
   first system block ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…;
   cch=…;`` whose ``cch`` changes on every request. Any system block that is only
   ``x-anthropic-<name>: …`` header lines is dropped, and such lines are stripped
   from the start of a block or of a string system prompt (``strip_volatile``, also used for
   the OpenAI API, where proxies put the same line into the system message).
2. ``cache_control`` markers (on system blocks, tools and message blocks) are
   ignored: Claude Code moves its breakpoints every turn, and kvroute caches every
   prefix automatically anyway.
3. ``thinking`` blocks become the assistant message's past reasoning
   (``reasoning_content``), which the model's template renders as it does its own
   (most keep only the reasoning after the last user message); their signatures are
   ignored. ``redacted_thinking`` blocks are dropped (nothing readable in them).
4. A string ``content`` and a list of text blocks with the same text render the
   same (blocks are joined with ``"\\n"``), as do system as a string and as blocks
   (joined with ``"\\n\\n"``).
5. Tools keep only ``name``, ``description`` and ``input_schema`` (as the
   OpenAI-style function list the templates expect), in the client's order; tools
   with ``defer_loading`` are left out, as Anthropic's tool search does (Claude
   Code's ``ToolSearch`` returns their definitions as text when the model asks).
6. ``system`` messages inside ``messages`` (Claude Code's environment block) stay
   where they are when the template renders them there, else become user text
   (``place_system``).

Not normalised, on purpose: anything with meaning for the model (dates,
``<system-reminder>`` text, git status in Claude Code's system prompt, tool
order). Changing those changes the answer; they change rarely within a session.

Bounded before rendering: a ``tool_reference`` block copies the definition of the tool
it names where it stands, and every copy counts against the text a prompt may hold
(``router.api.common.limits.Expansion``), so a small body of many references is a 413
naming the block past it, not millions of tokens.

Mapping onto the template's message list: ``tool_use`` blocks → the assistant
message's ``tool_calls``; each ``tool_result`` → a ``role: "tool"`` message with
``tool_call_id`` (and the tool's ``name``), its text prefixed with ``"Error: "``
when ``is_error``; text blocks → ``user``/``assistant`` content. ``image`` and
``document`` blocks are refused with a 400 (text-only models). A final
assistant message of text only is a *prefill*: the reply continues it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from router.api.anthropic.schema import (
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from router.api.common.limits import MAX_TEXT_CHARS, Expansion
from router.errors import ApiError, clip
from router.output.reasoning_parsers.controls import budget_effort, options, with_past_reasoning
from router.prompt.template import ChatPrompt, place_system, strip_volatile
from router.prompt.tokenizer import TemplateOptions


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return strip_volatile(system)
    texts = (strip_volatile(b.text) for b in system)
    return "\n\n".join(t for t in texts if t.strip())


def to_chat(req: CountTokensRequest, system_in_place: bool = True,
            max_chars: int = MAX_TEXT_CHARS) -> ChatPrompt:
    """The template's input; ``system_in_place``: the template renders a later system
    message where it stands (``ChatTokenizer.system_in_place``); ``max_chars``: the most
    text ``tool_reference`` blocks may add (the target's ``max_prompt_chars``), checked
    as each expands, before anything is rendered."""
    prompt = ChatPrompt(tools=template_tools(req.tools), options=_thinking(req))
    system = system_text(req.system)
    if system is not None:
        prompt.messages.append({"role": "system", "content": system})
    refs = _Refs(tools={t.name: _function(t) for t in req.tools or ()
                        if t.input_schema is not None and t.type in (None, "custom")},
                 room=Expansion(max_chars))
    for i, msg in enumerate(req.messages):
        where = f"messages.{i}.content"
        if msg.role == "assistant":
            prompt.messages.append(_assistant(msg, where, refs))
        elif msg.role == "system":  # Claude Code's environment block, mid-conversation
            prompt.messages.append({"role": "system", "content": _system_message(msg, where)})
        else:
            prompt.messages.extend(_user(msg, where, refs))
    last = req.messages[-1]
    if last.role == "assistant" and "tool_calls" not in prompt.messages[-1]:
        prompt.prefill = prompt.messages.pop()["content"]
    prompt.messages = place_system(prompt.messages, system_in_place)
    return prompt


def _thinking(req: CountTokensRequest) -> TemplateOptions:
    """``thinking`` and ``output_config.effort`` → the thinking templates' variables."""
    effort = req.output_config.effort if req.output_config else None
    if req.thinking is None or req.thinking.type not in ("enabled", "adaptive", "disabled"):
        return options(None, effort)
    if req.thinking.type == "disabled":
        return options(False)
    return options(True, effort or budget_effort(req.thinking.budget_tokens))


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.defer_loading:  # not in the prompt until a tool search names it
            continue
        if t.type not in (None, "custom") or t.input_schema is None:
            raise ApiError(400, f"tools.{i}: server tool {clip(t.type or t.name)!r} is not "
                           "supported; kvroute serves client tools (name, description, "
                           "input_schema)",
                           "unsupported_tool", f"tools.{i}")
        out.append({"type": "function", "function": _function(t)})
    return out or None


def _function(tool: Tool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name}
    if tool.description:
        fn["description"] = tool.description
    fn["parameters"] = tool.input_schema
    return fn


@dataclass(slots=True)
class _Refs:
    """What later blocks refer to: tool_use ids → tool names (for tool messages), and
    every client tool, deferred ones included (for ``tool_reference`` blocks)."""

    tools: dict[str, dict[str, Any]]
    room: Expansion
    calls: dict[str, str] = field(default_factory=dict)
    expanded: dict[str, str] = field(default_factory=dict)  # each tool's JSON, made once


def _blocks(msg: Message) -> list[Any]:
    return [TextBlock(type="text", text=msg.content)] if isinstance(msg.content, str) \
        else list(msg.content)


def _refuse(block: Any, where: str) -> None:
    if isinstance(block, ImageBlock | DocumentBlock):
        raise ApiError(400, f"{where}: {block.type} blocks are not supported: kvroute serves "
                       "text-only models", "unsupported_content", where)


def _system_message(msg: Message, where: str) -> str:
    texts = []
    for j, block in enumerate(_blocks(msg)):
        if not isinstance(block, TextBlock):
            raise ApiError(400, f"{where}.{j}: a system message holds text blocks only, not "
                           f"{block.type}", "invalid_request", f"{where}.{j}")
        texts.append(strip_volatile(block.text))
    return "\n".join(texts)


def _assistant(msg: Message, where: str, refs: _Refs) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(msg)):
        _refuse(block, f"{where}.{j}")
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            refs.calls[block.id] = block.name
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": block.input}})
        elif isinstance(block, ToolResultBlock):
            raise ApiError(400, f"{where}.{j}: tool_result blocks belong in user messages",
                           "invalid_request", f"{where}.{j}")
        # redacted_thinking: dropped (see the module docstring)
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    return with_past_reasoning(out, "\n".join(t for t in thoughts if t))


def _user(msg: Message, where: str, refs: _Refs) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(_blocks(msg)):
        _refuse(block, f"{where}.{j}")
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_message(block, f"{where}.{j}", refs))
        elif isinstance(block, ToolUseBlock):
            raise ApiError(400, f"{where}.{j}: tool_use blocks belong in assistant messages",
                           "invalid_request", f"{where}.{j}")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_message(block: ToolResultBlock, where: str, refs: _Refs) -> dict[str, Any]:
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        texts = []
        for k, part in enumerate(block.content):
            _refuse(part, f"{where}.content.{k}")
            if isinstance(part, TextBlock):
                texts.append(part.text)
            elif isinstance(part, ToolReferenceBlock):
                texts.append(_expand(part, refs, f"{where}.content.{k}"))
        text = "\n".join(texts)
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": block.tool_use_id,
                           "content": f"Error: {text}" if block.is_error else text}
    if block.tool_use_id in refs.calls:
        msg["name"] = refs.calls[block.tool_use_id]
    return msg


def _expand(part: ToolReferenceBlock, refs: _Refs, where: str) -> str:
    """A tool search's ``tool_reference``: the tool's definition, where the result stands
    (as Anthropic's API expands it), in the JSON the template's tool list uses."""
    text = refs.expanded.get(part.tool_name)
    if text is None:
        fn = refs.tools.get(part.tool_name)
        if fn is None:
            raise ApiError(400, f"{where}: tool_reference names {clip(part.tool_name)!r}, "
                           "which is not among the request's tools", "invalid_request",
                           f"{where}.tool_name")
        text = refs.expanded[part.tool_name] = json.dumps({"type": "function", "function": fn},
                                                          ensure_ascii=False)
    refs.room.add_chars(len(text), where)  # each copy counts: the prompt holds each one
    return text
