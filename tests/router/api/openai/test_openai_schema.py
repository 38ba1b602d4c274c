"""An OpenAI chat request → the chat template's message list."""

from __future__ import annotations

from typing import Any

from router.api.openai.schema import ChatCompletionRequest


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


def test_response_format_leaves_the_messages_as_written() -> None:
    """Decoding enforces the format (``ResponseFormat.constraint``): no instruction is
    added, so the prompt and its cached prefix are the same with or without it."""
    msgs = ({"role": "system", "content": "S"}, {"role": "user", "content": "u"})
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {
            "name": "A", "schema": {"type": "object"}, "strict": True}}):
        assert _req(*msgs, response_format=fmt).template_messages() == \
            _req(*msgs).template_messages()
