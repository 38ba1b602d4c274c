"""gpt-oss (harmony) on recorded outputs.

The conversations are those of vLLM's tests/tool_parsers/test_openai_tool_parser.py
(Apache-2.0, vllm-project/vllm), rendered to text by ``openai_harmony`` as the model
writes them; the literal outputs follow the harmony format's own examples
(openai/harmony docs/format.md, Apache-2.0).
"""

from __future__ import annotations

import pytest
from openai_harmony import Conversation, Message, Role

from router.output.tool_parsers import ToolCall
from router.output.tool_parsers.gpt_oss import _encoding
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

ANALYSIS = 'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.'


def rendered(*messages: Message) -> str:
    """What the model wrote after ``<|start|>assistant`` for these assistant messages."""
    enc = _encoding()
    prompt = enc.render_conversation_for_completion(
        Conversation.from_messages([Message.from_role_and_content(Role.USER, "Hi")]),
        Role.ASSISTANT)
    full = enc.render_conversation(Conversation.from_messages(
        [Message.from_role_and_content(Role.USER, "Hi"), *messages]))
    return enc.decode_utf8(full[len(prompt):])


def call(name: str, args: str, content_type: str | None = "json") -> Message:
    msg = (Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
           .with_recipient(f"functions.{name}"))
    return msg.with_content_type(content_type) if content_type else msg


def analysis(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def final(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final")


TOKYO = '{"location": "Tokyo"}'


@pytest.mark.parametrize(("messages", "expected"), [
    ([final("This is a test")], ["This is a test"]),
    ([analysis(ANALYSIS), call("get_current_weather", TOKYO)],
     [ANALYSIS, ToolCall("get_current_weather", {"location": "Tokyo"})]),
    ([analysis(ANALYSIS), call("get_current_weather", '{\n"location": "Tokyo"\n}')],
     [ANALYSIS, ToolCall("get_current_weather", {"location": "Tokyo"})]),
    ([call("get_current_weather", TOKYO), call("get_user_location", TOKYO),
      call("no_content_type", TOKYO, None), call("empty_args", "{}"), call("no_args", "")],
     [ToolCall("get_current_weather", {"location": "Tokyo"}),
      ToolCall("get_user_location", {"location": "Tokyo"}),
      ToolCall("no_content_type", {"location": "Tokyo"}), ToolCall("empty_args", {}),
      ToolCall("no_args", {})]),
    ([call("get_current_weather", TOKYO), final("This tool call will get the weather.")],
     [ToolCall("get_current_weather", {"location": "Tokyo"}),
      "This tool call will get the weather."]),
])
def test_harmony_rendered_outputs(messages: list[Message], expected: Expected) -> None:
    check_streaming("gpt-oss", rendered(*messages), expected)


@pytest.mark.parametrize(("text", "expected"), [
    # The model's own form: the recipient after the channel; the engine stopped on <|call|>.
    ('<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant'
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
     '{"location":"San Francisco"}',
     ["Need to use function get_weather.", ToolCall("get_weather", {"location": "San Francisco"})]),
    ('<|channel|>final<|message|>2 + 2 = 4.<|return|>', ["2 + 2 = 4."]),
    # What the reasoning parser leaves: the answer's text, then the call verbatim.
    ('Checking.<|start|>assistant<|channel|>commentary to=functions.ls <|constrain|>json'
     '<|message|>{}<|call|>', ["Checking.", ToolCall("ls", {})]),
    # Not JSON: given back as text, unchanged.
    ('<|channel|>commentary to=functions.f<|message|>foo<|call|>',
     ['<|channel|>commentary to=functions.f<|message|>foo<|call|>']),
    ("No harmony here < | at all", ["No harmony here < | at all"]),
])
def test_literal_outputs(text: str, expected: Expected) -> None:
    check_streaming("gpt-oss", text, expected)
