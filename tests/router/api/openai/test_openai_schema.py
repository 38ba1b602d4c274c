"""An OpenAI chat request → the chat template's message list."""

from __future__ import annotations

from typing import Any

from router.api.openai.schema import ChatCompletionRequest

JSON_NOTE = "Respond with a single valid JSON object and nothing else."


def _req(*messages: dict[str, Any], **fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(messages),
                                                 **fields})


def test_developer_is_system_and_volatile_lines_are_stripped() -> None:
    req = _req({"role": "developer", "content": "x-anthropic-billing-header: cch=1;\nBe brief."},
               {"role": "user", "content": [{"type": "text", "text": "hi"}]})
    assert req.template_messages() == [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "hi"}]


def test_tool_calls_carry_arguments_as_mappings() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    req = _req({"role": "user", "content": "go"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "done"})
    out = req.template_messages()
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert out[2] == {"role": "tool", "content": "done", "tool_call_id": "c1"}


def test_response_format_note_ends_the_system_prompt_or_becomes_one() -> None:
    fmt = {"type": "json_object"}
    with_system = _req({"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                       response_format=fmt)
    assert with_system.template_messages()[0] == {"role": "system",
                                                  "content": f"S\n\n{JSON_NOTE}"}
    without = _req({"role": "user", "content": "u"}, response_format=fmt)
    assert without.template_messages()[0] == {"role": "system", "content": JSON_NOTE}
