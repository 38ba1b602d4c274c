"""Prefix-stable normalisation of Anthropic conversations, on Claude-Code-shaped requests.

``claude_code_turns`` builds a replayed Claude Code session (billing-header system
block with a fresh nonce per request, about 80 tool descriptions, moving
``cache_control`` breakpoints, growing messages with tool use); the end-to-end
agent tests replay the same session against the real stack.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from router.api.anthropic.normalize import system_text, to_chat
from router.api.anthropic.schema import CountTokensRequest
from router.errors import ApiError
from router.prompt.template import strip_volatile
from router.prompt.tokenizer import ChatTokenizer

_WORDS = ("file", "path", "search", "pattern", "read", "write", "edit", "command", "output",
          "line", "offset", "limit", "glob", "regex", "timeout", "background", "task", "agent")


def _text(seed: int, n: int) -> str:
    return " ".join(_WORDS[(seed * 5 + i * 7) % len(_WORDS)] for i in range(n))


def claude_code_tools(n: int = 80, compact: bool = False) -> list[dict[str, Any]]:
    """Claude Code's built-in tools, then MCP tools; ``compact`` keeps each one short."""
    base = ["Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read", "Edit", "MultiEdit",
            "Write", "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput"]
    names = base + [f"mcp__s{i // 10}__t{i}" for i in range(n - len(base))]
    if compact:
        return [{"name": name, "description": _text(i, 2), "input_schema": {"type": "object"}}
                for i, name in enumerate(names)]
    return [{
        "name": name, "description": f"{name}: " + _text(i, 10),
        "input_schema": {"type": "object", "$schema": "http://json-schema.org/draft-07/schema#",
                         "additionalProperties": False, "required": ["arg"],
                         "properties": {"arg": {"type": "string", "description": _text(i, 4)}}},
    } for i, name in enumerate(names)]


def claude_code_system(nonce: str, words: int = 300) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.177.01c; "
                                 f"cc_entrypoint=cli; cch={nonce};"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "You are an interactive CLI tool. " + _text(3, words),
         "cache_control": {"type": "ephemeral"}},
    ]


def claude_code_turns() -> list[list[dict[str, Any]]]:
    """Messages of three successive requests (each a prefix of the next, as sent)."""
    u1 = {"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\n" + _text(7, 60) + "\n</system-reminder>"},
        {"type": "text", "text": "Fix the failing test in src/app.py"}]}
    a1 = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look first", "signature": "sig-" + "a" * 40},
        {"type": "text", "text": "I'll read the file first."},
        {"type": "tool_use", "id": "toolu_01A", "name": "Read",
         "input": {"file_path": "/repo/src/app.py"}}]}
    u2 = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A",
         "content": [{"type": "text", "text": "1\tdef add(a, b):\n2\t    return a - b\n"}]}]}
    a2 = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_01B", "name": "Edit",
         "input": {"file_path": "/repo/src/app.py", "old": "a - b", "new": "a + b"}}]}
    u3 = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01B", "is_error": True,
         "content": "<tool_use_error>File has not been read</tool_use_error>"},
        {"type": "text", "text": "Please try again."}]}
    return [[u1], [u1, a1, u2], [u1, a1, u2, a2, u3]]


def with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code moves a cache_control breakpoint onto the last block of each request."""
    out = copy.deepcopy(messages)
    last = out[-1]["content"]
    if isinstance(last, list):
        last[-1]["cache_control"] = {"type": "ephemeral"}
    return out


def claude_code_request(turn: int, nonce: str, model: str = "tiny",
                        compact: bool = False) -> dict[str, Any]:
    """Request ``turn`` (0..2) of the replayed session; ``compact`` for slow CPU engines."""
    return {"model": model, "max_tokens": 32000, "stream": True, "temperature": 1,
            "system": claude_code_system(nonce, 40 if compact else 300),
            "tools": claude_code_tools(compact=compact),
            "metadata": {"user_id": "user_0f3a_account__session_5d2c"},
            "messages": with_breakpoint(claude_code_turns()[turn])}


def _render(tok: ChatTokenizer, body: dict[str, Any]) -> str:
    prompt = to_chat(CountTokensRequest.model_validate(body))
    return tok.render(prompt.messages, tools=prompt.tools) + (prompt.prefill or "")


@pytest.mark.parametrize("compact", [False, True])
def test_each_turn_extends_the_previous_prompt(tiny_model_dir: Path, compact: bool) -> None:
    tok = ChatTokenizer(str(tiny_model_dir))
    prompts = [_render(tok, claude_code_request(t, nonce, compact=compact)) for t, nonce in
               enumerate(["36ee5", "0aaa9", "97bd6"])]
    for before, after in zip(prompts, prompts[1:], strict=False):
        gen_prompt = "<|im_start|>assistant\n"
        assert after.startswith(before.removesuffix(gen_prompt))
        ids_before, ids_after = tok.encode(before), tok.encode(after)
        common = next((i for i, (a, b) in enumerate(zip(ids_before, ids_after, strict=False))
                       if a != b), len(ids_before))
        assert common >= 0.95 * len(ids_before)
    assert "cch=" not in prompts[0] and "billing" not in prompts[0]
    # The tiny template renders no past reasoning; signatures never reach a template.
    assert "sig-" not in prompts[1] and "look first" not in prompts[1]
    assert prompts[0].count('{"type": "function"') == 80


def test_billing_nonce_does_not_change_the_prompt(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir))
    assert _render(tok, claude_code_request(1, "aaaaa")) == \
        _render(tok, claude_code_request(1, "bbbbb"))


def test_tool_use_and_results_map_onto_the_template() -> None:
    body = claude_code_request(2, "x")
    msgs = to_chat(CountTokensRequest.model_validate(body)).messages
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant",
                                         "tool", "user"]
    assert msgs[0]["content"].startswith("You are Claude Code, Anthropic's official CLI")
    assert msgs[1]["content"].endswith("\nFix the failing test in src/app.py")
    assert msgs[2] == {"role": "assistant", "content": "I'll read the file first.",
                       "tool_calls": [{"id": "toolu_01A", "type": "function", "function": {
                           "name": "Read", "arguments": {"file_path": "/repo/src/app.py"}}}],
                       "reasoning_content": "look first", "thinking": "look first"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_01A", "name": "Read",
                       "content": "1\tdef add(a, b):\n2\t    return a - b\n"}
    assert msgs[5]["content"].startswith("Error: <tool_use_error>")
    assert msgs[6] == {"role": "user", "content": "Please try again."}


def test_tools_become_openai_style_functions() -> None:
    tools = to_chat(CountTokensRequest.model_validate(claude_code_request(0, "x"))).tools
    assert tools is not None and len(tools) == 80
    assert tools[1] == {"type": "function", "function": {
        "name": "Bash", "description": claude_code_tools()[1]["description"],
        "parameters": claude_code_tools()[1]["input_schema"]}}


def test_string_and_block_forms_render_the_same(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir))
    as_str = {"model": "m", "system": "Be brief.",
              "messages": [{"role": "user", "content": "hi"}]}
    as_blocks = {"model": "m", "system": [{"type": "text", "text": "Be brief.",
                                           "cache_control": {"type": "ephemeral"}}],
                 "messages": [{"role": "user", "content": [
                     {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}
    assert _render(tok, as_str) == _render(tok, as_blocks)


@pytest.mark.parametrize(("text", "expected"), [
    ("x-anthropic-billing-header: cc_version=2.1.37.0d9; cch=fa690;", ""),
    ("x-anthropic-billing-header: cch=1;\nYou are helpful.", "You are helpful."),
    ("You are helpful.\nx-anthropic-billing-header: cch=1;", "You are helpful.\n"
     "x-anthropic-billing-header: cch=1;"),  # only leading header lines go
    ("plain", "plain"),
    ("", ""),
])
def test_strip_volatile(text: str, expected: str) -> None:
    assert strip_volatile(text) == expected


def test_system_blocks_join_and_drop_volatile_ones() -> None:
    assert system_text(None) is None
    blocks = CountTokensRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}],
         "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=2;"},
                    {"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}).system
    assert system_text(blocks) == "A\n\nB"


def test_prefill_and_refusals() -> None:
    req = CountTokensRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "Pick"}, {"role": "assistant", "content": "The ("}]})
    prompt = to_chat(req)
    assert prompt.prefill == "The (" and prompt.messages[-1]["role"] == "user"
    for bad in (
        {"role": "user", "content": [{"type": "document", "source": {"type": "text"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "u"}}]}]},
        {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
    ):
        with pytest.raises(ApiError) as err:
            to_chat(CountTokensRequest.model_validate({"model": "m", "messages": [bad]}))
        assert err.value.status == 400 and err.value.param
