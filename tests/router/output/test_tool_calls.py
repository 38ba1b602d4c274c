"""Tool-call parsing per model family, on recorded model outputs, fed whole and in
every two-piece split (the streaming case); and the OpenAI chat route's tool calls and
response_format with the openai SDK against the route over a scripted core."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from router.output.tool_calls import (
    FAMILIES,
    ToolCall,
    detect_family,
    family_for_model,
    make_parser,
)
from tests.router.api.anthropic.test_anthropic_api import FakeCore, Script, make_client

# Recorded outputs in the hermes format (Qwen2.5-Coder-7B-Instruct, Claude-Code-like tools).
QWEN_ONE = ('<tool_call>\n{"name": "Read", "arguments": {"file_path": "/repo/src/main.py"}}\n'
            '</tool_call>')
QWEN_TEXT_TWO = (
    "I'll check the file and list the folder.\n<tool_call>\n"
    '{"name": "Read", "arguments": {"file_path": "a.py", "limit": 40}}\n</tool_call>\n'
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la", '
    '"description": "List files"}}\n</tool_call>'
)
QWEN_STRING_ARGS = ('<tool_call>\n{"name": "Grep", "arguments": "{\\"pattern\\": \\"TODO\\"}"}\n'
                    '</tool_call>')
QWEN_UNICODE = ('<tool_call>\n{"name": "Write", "arguments": {"file_path": "é.md", '
                '"content": "héllo {\\"x\\": [1, 2]}\\n"}}\n</tool_call>')
QWEN_NO_CLOSE = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "x"}}\n'  # EOS first
QWEN_CUT = '<tool_call>\n{"name": "Read", "arguments": {"file_pa'  # max_tokens hit
QWEN_BAD = 'Try <tool_call>{"name": Read}</tool_call> again'
PLAIN = "The answer is 42.\n\nNo tools needed: x < y and <tool> is fine."


def run(family: str, chunks: list[str]) -> list[str | ToolCall]:
    parser = make_parser(family)
    assert parser is not None
    out: list[str | ToolCall] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.flush()


def merged(events: list[str | ToolCall]) -> list[str | ToolCall]:
    """Adjacent text events joined: the same content however the output was chunked."""
    out: list[str | ToolCall] = []
    for ev in events:
        if isinstance(ev, str) and out and isinstance(out[-1], str):
            out[-1] += ev
        else:
            out.append(ev)
    return out


def check_all_splits(family: str, text: str, expected: list[str | ToolCall]) -> None:
    assert merged(run(family, [text])) == expected
    assert merged(run(family, list(text))) == expected  # one character at a time
    for i in range(len(text) + 1):
        assert merged(run(family, [text[:i], text[i:]])) == expected, i


@pytest.mark.parametrize(("text", "expected"), [
    (QWEN_ONE, [ToolCall("Read", {"file_path": "/repo/src/main.py"})]),
    (QWEN_TEXT_TWO, ["I'll check the file and list the folder.",
                     ToolCall("Read", {"file_path": "a.py", "limit": 40}),
                     ToolCall("Bash", {"command": "ls -la", "description": "List files"})]),
    (QWEN_STRING_ARGS, [ToolCall("Grep", {"pattern": "TODO"})]),
    (QWEN_UNICODE, [ToolCall("Write", {"file_path": "é.md", "content": 'héllo {"x": [1, 2]}\n'})]),
    (QWEN_NO_CLOSE, [ToolCall("Read", {"file_path": "x"})]),
    (QWEN_CUT, [QWEN_CUT]),  # an incomplete call is given back as text
    (QWEN_BAD, ['Try <tool_call>{"name": Read}</tool_call> again']),
    (PLAIN, [PLAIN]),
    ("ends in a partial marker <tool_", ["ends in a partial marker <tool_"]),
])
def test_hermes_recorded_outputs(text: str, expected: list[str | ToolCall]) -> None:
    check_all_splits("hermes", text, expected)


def test_text_before_a_call_streams_before_the_call_completes() -> None:
    parser = make_parser("hermes")
    assert parser is not None
    assert parser.feed("Let me look") == ["Let me look"]
    assert parser.feed(" at it.\n<tool") == [" at it."]  # the newline waits, then is dropped
    assert parser.feed('_call>\n{"name": "Read", "arguments": {}}') == []
    assert parser.feed("\n</tool_call>") == [ToolCall("Read", {})]
    assert parser.flush() == []


@pytest.mark.parametrize(("family", "text", "expected"), [
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "ls", "arguments": {}}]',
     [ToolCall("get_weather", {"city": "Paris"}), ToolCall("ls", {})]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]ls[ARGS]{}',
     ["Sure.", ToolCall("get_weather", {"city": "Paris"}), ToolCall("ls", {})]),
    ("mistral", "[TOOL_CALLS]oops not json", ["[TOOL_CALLS]oops not json"]),
    ("llama3-json", '{"name": "search", "parameters": {"query": "kv cache"}}',
     [ToolCall("search", {"query": "kv cache"})]),
    ("llama3-json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", '
                    '"parameters": {"x": 1}}',
     [ToolCall("a", {}), ToolCall("b", {"x": 1})]),
    ("llama3-json", "Hello {there}", ["Hello {there}"]),
    ("llama3-json", '{"not": "a call"}', ['{"not": "a call"}']),
])
def test_other_families(family: str, text: str, expected: list[str | ToolCall]) -> None:
    check_all_splits(family, text, expected)


def test_detection_from_templates(tiny_model_dir: Path) -> None:
    assert family_for_model(str(tiny_model_dir)) == "hermes"
    assert detect_family("{{ '[TOOL_CALLS]' + tools|tojson }}") == "mistral"
    assert detect_family("{{- '<|python_tag|>' }}") == "llama3-json"
    assert detect_family("{{ message.content }}") is None
    assert detect_family(None) is None
    assert make_parser(None) is None and make_parser("nope") is None
    assert set(FAMILIES) >= {"hermes", "mistral", "llama3-json"}


def test_arguments_json_round_trips() -> None:
    call = ToolCall("Write", {"content": "héllo", "n": [1, {"a": None}]})
    assert json.loads(call.arguments_json()) == call.arguments


# -- the OpenAI chat route -----------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "Read", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}}]


def _openai(core: FakeCore) -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                         http_client=make_client(core))


def test_openai_tools_are_templated_and_calls_parsed(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["Reading.\n", QWEN_ONE[:20], QWEN_ONE[20:]]))
    resp = _openai(core).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "open main"}], tools=TOOLS,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Reading."
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "Read"
    assert json.loads(call.function.arguments) == {"file_path": "/repo/src/main.py"}
    prompt = core.prompt_text()
    assert '"name": "Read"' in prompt and "<tools>" in prompt  # the template rendered them


def test_openai_streamed_tool_calls(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=list(QWEN_TEXT_TWO)))
    stream = _openai(core).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], tools=TOOLS, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "Read"), (1, "Bash")]
    assert json.loads(calls[1].function.arguments)["command"] == "ls -la"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "I'll check the file and list the folder."
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None


@pytest.mark.parametrize(("extra", "calls", "reason"), [
    ({"tool_choice": "none"}, 0, "stop"),  # markup stays text
    ({"parallel_tool_calls": False}, 1, "tool_calls"),
])
def test_openai_tool_choice(tiny_model_dir: Path, extra: dict[str, Any], calls: int,
                            reason: str) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=[QWEN_TEXT_TWO]))
    resp = _openai(core).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], tools=TOOLS, **extra,
    )
    assert len(resp.choices[0].message.tool_calls or []) == calls
    assert resp.choices[0].finish_reason == reason
    if not calls:
        assert "<tool_call>" in (resp.choices[0].message.content or "")


def test_openai_without_tools_passes_markup_through(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=[QWEN_ONE], finish="length"))
    resp = _openai(core).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}],
    )
    assert resp.choices[0].message.content == QWEN_ONE
    assert resp.choices[0].finish_reason == "length"


def test_openai_history_with_tool_calls_renders(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["done"]))
    messages: list[Any] = [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1a2b3;\nBe brief."},
        {"role": "user", "content": "open main"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "Read", "arguments": '{"file_path": "m.py"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
    ]
    _openai(core).chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                          seed=7, temperature=0.3, top_p=0.9, stop=["END"])
    prompt = core.prompt_text()
    assert '{"name": "Read", "arguments": {"file_path": "m.py"}}' in prompt
    assert "<tool_response>\nprint(1)\n</tool_response>" in prompt
    assert "billing" not in prompt and "Be brief." in prompt
    s = core.calls[-1]["sampling"]
    assert (s.seed, s.temperature, s.top_p, s.stop) == (7, 0.3, 0.9, ("END",))


def test_openai_response_format(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=['{"a": 1}']))
    client = _openai(core)
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                   response_format={"type": "json_object"})
    assert core.calls[-1]["sampling"].constraint.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for strict in (False, True):  # enforced either way, nothing added to the prompt
        client.chat.completions.create(
            model="tiny", messages=[{"role": "system", "content": "sys"},
                                    {"role": "user", "content": "x"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "A", "schema": schema, "strict": strict}},
        )
        assert core.prompt_text().startswith("<|im_start|>system\nsys<|im_end|>")
        assert json.loads(core.calls[-1]["sampling"].constraint.text) == schema


def test_token_id_prompts_meet_the_window_before_their_ids_are_scanned(
        tiny_model_dir: Path) -> None:
    """An over-long token-id prompt is a 400 from its length alone,
    before every id is range-checked (the last id here is out of range)."""
    import asyncio

    from router.api.openai import routes as openai_routes
    from router.errors import ApiError
    from tests.router.api.anthropic.test_anthropic_api import _request

    core = FakeCore(tiny_model_dir, context_window=4096)
    req = _request({"model": "tiny", "prompt": [5] * 5000 + [10**9], "max_tokens": 4})
    try:
        asyncio.run(openai_routes.completions(core, req))  # type: ignore[arg-type]
    except ApiError as e:
        assert (e.status, e.code) == (400, "context_length_exceeded")
    else:
        raise AssertionError("no 400")


def test_tool_parser_is_checked_at_config_load_and_overrides_detection(
        tiny_model_dir: Path) -> None:
    from pydantic import ValidationError

    from deploy.config import ModelConfig
    from router.output.tool_calls import parser_for

    with pytest.raises(ValidationError, match=r"tool_parser 'qwen9'.*known: \[.*'hermes'"):
        ModelConfig(name="m", model_path=str(tiny_model_dir), tool_parser="qwen9")
    forced = ModelConfig(name="m", model_path=str(tiny_model_dir), tool_parser="mistral")
    parser = parser_for(forced, None)
    assert parser is not None  # the tiny model's own template says hermes; config wins
    assert parser.feed("[TOOL_CALLS]ls[ARGS]{}") == [] and parser.flush() == [ToolCall("ls", {})]
    detected = parser_for(ModelConfig(name="m", model_path=str(tiny_model_dir)), None)
    assert detected is not None and detected.flush() == []
    assert detected.feed(QWEN_ONE) == [ToolCall("Read", {"file_path": "/repo/src/main.py"})]


def test_an_unknown_family_is_logged_once_and_its_text_passes_through(
        tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    from deploy.config import ModelConfig
    from router.output.tool_calls import parser_for

    folder = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}"
    cfg["added_tokens_decoder"] = {}  # no marker among the tokens either
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    model = ModelConfig(name="plain", model_path=str(folder))
    with caplog.at_level("WARNING", logger="router.output.tool_calls"):
        assert parser_for(model, TOOLS) is None and parser_for(model, TOOLS) is None
    assert [r.getMessage() for r in caplog.records].count(
        f"no tool-call family recognised for {folder} (set tool_parser in its config; known: "
        f"{', '.join(sorted(FAMILIES))}): tool-call markup passes through as text") == 1
