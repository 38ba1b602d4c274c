"""Past reasoning rendered by each thinking family's own public chat template
(ops/ and tests/chat_templates, from llama.cpp's models/templates/; Kimi-K2-Thinking's from
ggml-org/llama.cpp models/templates/moonshotai-Kimi-K2-Thinking.jinja), through
kvroute's template path: detection, the reasoning switches, and what each template
keeps of the reasoning a client sends back (in a tool loop, and after a new user
message). The three APIs' ways of sending reasoning back give the same prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.config import ModelConfig
from router.api.anthropic.normalize import to_chat as anthropic_to_chat
from router.api.anthropic.schema import CountTokensRequest
from router.api.openai.schema import ChatCompletionRequest
from router.api.responses.normalize import Conversation
from router.api.responses.normalize import to_chat as responses_to_chat
from router.api.responses.schema import ResponsesRequest
from router.output.reasoning_parsers import for_request, resolve
from router.output.reasoning_parsers.controls import options
from router.prompt.template import place_system
from router.prompt.tokenizer import ChatTokenizer
from tests.router.output.tool_parsers.family_models import template_model_dir

# family → (template, keeps reasoning in a tool loop, keeps it after a new user message)
FAMILIES = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", True, False),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1.jinja", False, False),
    "glm-4.5": ("GLM-4.6.jinja", True, False),
    "minimax-m2": ("MiniMax-M2.jinja", True, False),
    "kimi-k2": ("moonshotai-Kimi-K2-Thinking.jinja", True, False),
    "gpt-oss": ("openai-gpt-oss-120b.jinja", True, False),
}
THOUGHT = "R1: the weather tool knows Paris."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def toks(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, ChatTokenizer]:
    root = tmp_path_factory.mktemp("thinking")
    return {f: ChatTokenizer(str(template_model_dir(tiny_model_dir, t, root / f)))
            for f, (t, _, _) in FAMILIES.items()}


def tool_loop(final_user: bool) -> list[dict[str, Any]]:
    """A chat conversation: a call made after reasoning, its result, maybe a new question."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": THOUGHT, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    if final_user:
        msgs += [{"role": "assistant", "content": "Sunny."},
                 {"role": "user", "content": "And tomorrow?"}]
    return msgs


def render_chat(tok: ChatTokenizer, messages: list[dict[str, Any]], **extra: Any) -> str:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages,
                                                "tools": TOOLS, **extra})
    msgs = place_system(req.template_messages(), tok.system_in_place)
    return tok.render(msgs, req.template_tools(), options=req.template_options())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_detected_from_its_template(toks: dict[str, ChatTokenizer], family: str) -> None:
    model = ModelConfig(name="m", engine="sim", model_path="/x")
    spec = resolve(model, toks[family])
    assert spec is not None and spec.name == family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_past_reasoning_as_each_template_keeps_it(toks: dict[str, ChatTokenizer],
                                                   family: str) -> None:
    _, in_loop, after_user = FAMILIES[family]
    tok = toks[family]
    assert (THOUGHT in render_chat(tok, tool_loop(final_user=False))) is in_loop
    assert (THOUGHT in render_chat(tok, tool_loop(final_user=True))) is after_user


def test_reasoning_switches_reach_the_templates(toks: dict[str, ChatTokenizer]) -> None:
    ask = [{"role": "user", "content": "hi"}]
    qwen, ds, oss = toks["qwen3"], toks["deepseek-v3.1"], toks["gpt-oss"]
    assert render_chat(qwen, ask, reasoning_effort="none").endswith("<think>\n\n</think>\n\n")
    assert render_chat(qwen, ask).endswith("<|im_start|>assistant\n")
    assert render_chat(ds, ask, reasoning_effort="high").endswith("<｜Assistant｜><think>")
    assert render_chat(ds, ask).endswith("<｜Assistant｜><think></think>")
    assert "Reasoning: high" in render_chat(oss, ask, reasoning_effort="xhigh")
    assert "Reasoning: low" in oss.render(ask, options=options(True, "minimal"))


def test_output_starts_inside_when_the_prompt_opened_the_reasoning(
        toks: dict[str, ChatTokenizer]) -> None:
    model = ModelConfig(name="m", engine="sim", model_path="/x")
    ds = toks["deepseek-v3.1"]
    ask = [{"role": "user", "content": "hi"}]
    for effort, reasoning in (("high", "Thinking."), ("none", "")):
        ids = ds.encode(render_chat(ds, ask, reasoning_effort=effort))
        parser = for_request(model, ds, ids)
        assert parser is not None
        events = parser.feed("Thinking.</think>Hello.") + parser.flush()
        got = "".join(getattr(e, "text", "") for e in events if not isinstance(e, str))
        assert got == reasoning


def test_the_three_apis_send_reasoning_back_alike(toks: dict[str, ChatTokenizer]) -> None:
    """Chat ``reasoning_content``, an Anthropic ``thinking`` block and a Responses
    ``reasoning`` item give Qwen3 the same prompt, with the reasoning in it."""
    tok = toks["qwen3"]
    chat = render_chat(tok, tool_loop(final_user=False))
    fn = TOOLS[0]["function"]
    anthropic = CountTokensRequest.model_validate({
        "model": "m", "system": "Be brief.",
        "tools": [{"name": fn["name"], "description": fn["description"],
                   "input_schema": fn["parameters"]}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": THOUGHT, "signature": "sig"},
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                          "content": "Sunny, 21 C"}]}]})
    a = anthropic_to_chat(anthropic, tok.system_in_place)
    responses = ResponsesRequest.model_validate({
        "model": "m", "instructions": "Be brief.", "tools": [{"type": "function", **fn}],
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": THOUGHT}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]})
    r, _, _ = responses_to_chat(responses, Conversation(), tok.system_in_place)
    assert THOUGHT in chat
    assert tok.render(a.messages, a.tools) == chat
    assert tok.render(r.messages, r.tools) == chat


def test_a_stored_response_keeps_its_reasoning_for_the_next_turn() -> None:
    """``previous_response_id``: the stored assistant turn carries its reasoning, as a
    client sending the ``reasoning`` item back would."""
    from router.api.responses.encode import Output
    from router.api.responses.tools import ToolCatalog
    from router.output.reasoning_parsers import Reasoning

    out = Output(ResponsesRequest.model_validate({"model": "m", "input": "hi"}), "resp_1",
                 ToolCatalog(), single_call=False)
    for ev in (Reasoning(THOUGHT), "Sunny."):
        out.add(ev)
    assert [i["type"] for i in out.items] == ["reasoning", "message"]
    assert out.conversation_tail() == {"role": "assistant", "content": "Sunny.",
                                       "reasoning_content": THOUGHT, "thinking": THOUGHT}


def test_gpt_oss_takes_reasoning_text_and_a_call_in_one_turn(
        toks: dict[str, ChatTokenizer]) -> None:
    """A harmony turn of analysis, a commentary preamble and a call, sent back: gpt-oss's
    template refuses text and reasoning on one tool-call turn, so the text joins the
    reasoning (``fit_history``), as the template would render the preamble anyway."""
    from router.output.reasoning_parsers import fit_history

    tok = toks["gpt-oss"]
    msgs = tool_loop(final_user=False)
    msgs[2]["content"] = "Checking."
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": msgs, "tools": TOOLS})
    raw = place_system(req.template_messages(), tok.system_in_place)
    with pytest.raises(ValueError, match="Cannot pass both content and thinking"):
        tok.render(raw, req.template_tools())
    text = tok.render(fit_history(tok.template_source, raw), req.template_tools())
    assert f"<|channel|>analysis<|message|>{THOUGHT}\n\nChecking.<|end|>" in text
    assert fit_history(toks["qwen3"].template_source, raw) == raw  # others take both


def test_responses_reasoning_items_without_text_or_in_a_row() -> None:
    def messages(*items: dict[str, Any]) -> list[dict[str, Any]]:
        req = ResponsesRequest.model_validate({"model": "m", "input": [
            {"role": "user", "content": "hi"}, *items,
            {"role": "assistant", "content": "Hello."}]})
        return responses_to_chat(req, Conversation(), True)[0].messages

    bare = messages()
    assert messages({"type": "reasoning", "summary": [], "encrypted_content": "zz"}) == bare
    two = messages(*({"type": "reasoning", "summary": [{"type": "summary_text", "text": t}]}
                     for t in ("A.", "B.")))
    assert two == [bare[0], {**bare[1], "reasoning_content": "A.\n\nB.", "thinking": "A.\n\nB."}]


def test_deepseek_v32_keeps_a_tool_loops_reasoning_when_thinking(tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    """DeepSeek-V3.2 (the same parser as V3.1) renders the current tool loop's reasoning
    in thinking mode only, so a client must ask for reasoning on every turn."""
    tok = ChatTokenizer(str(template_model_dir(
        tiny_model_dir, "deepseek-ai-DeepSeek-V3.2.jinja", tmp_path / "ds32")))
    model = ModelConfig(name="m", engine="sim", model_path="/x")
    assert resolve(model, tok).name == "deepseek-v3.1"  # type: ignore[union-attr]
    assert THOUGHT in render_chat(tok, tool_loop(False), reasoning_effort="high")
    assert THOUGHT not in render_chat(tok, tool_loop(False))
    assert THOUGHT not in render_chat(tok, tool_loop(True), reasoning_effort="high")
    assert render_chat(tok, tool_loop(False), reasoning_effort="high").endswith("<think>")
