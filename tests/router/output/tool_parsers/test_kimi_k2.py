"""kimi-k2 on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_kimi_k2_tool_parser.py (Apache-2.0,
vllm-project/vllm), model moonshotai/Kimi-K2-Instruct.
"""

from __future__ import annotations

import json

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
TOOL_BEGIN, TOOL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"


def _tool(tool_id: str, args: str) -> str:
    return f"{TOOL_BEGIN}{tool_id} {ARG_BEGIN}{args}{TOOL_END}"


def _wrap(*tools: str) -> str:
    return SECTION_BEGIN + "".join(tools) + SECTION_END


@pytest.mark.parametrize(("text", "expected"), [
    ("I'll check. " + _wrap(_tool("functions.get_weather:0", '{"city": "Beijing"}')),
     ["I'll check.", ToolCall("get_weather", {"city": "Beijing"})]),
    ("Compare weather. " + _wrap(_tool("functions.get_weather:0", '{"city": "Beijing"}'),
                                 _tool("functions.get_weather:1", '{"city": "Shanghai"}')),
     ["Compare weather.", ToolCall("get_weather", {"city": "Beijing"}),
      ToolCall("get_weather", {"city": "Shanghai"})]),
    ("Multiple tasks. " + _wrap(
        _tool("functions.get_weather:0", '{"city": "New York"}'),
        _tool("functions.get_news:1", '{"topic": "technology"}'),
        _tool("functions.send_email:2",
              '{"to": "user@example.com", "subject": "Daily Update"}')),
     ["Multiple tasks.", ToolCall("get_weather", {"city": "New York"}),
      ToolCall("get_news", {"topic": "technology"}),
      ToolCall("send_email", {"to": "user@example.com", "subject": "Daily Update"})]),
    ("Process HTML. " + _wrap(_tool("functions.process_html:0",
                                    '{"html": "<div>content</div>"}')),
     ["Process HTML.", ToolCall("process_html", {"html": "<div>content</div>"})]),
    ("Formatted. " + _wrap(_tool("functions.process_data:0",
                                 '{\n  "name": "test",\n  "value": 123\n}')),
     ["Formatted.", ToolCall("process_data", {"name": "test", "value": 123})]),
    ("No prefix. " + _wrap(_tool("get_weather:0", '{"city": "Tokyo"}')),
     ["No prefix.", ToolCall("get_weather", {"city": "Tokyo"})]),
    ("Empty args. " + _wrap(_tool("functions.test:0", "{}")),
     ["Empty args.", ToolCall("test", {})]),
    ("This is a test", ["This is a test"]),
    # Invalid JSON arguments: the section is given back as text, nothing lost.
    ("Help. " + _wrap(_tool("functions.bad:0", '{"city": "Beijing"')),
     ["Help. " + _wrap(_tool("functions.bad:0", '{"city": "Beijing"'))]),
])
def test_recorded_outputs(text: str, expected: Expected) -> None:
    check_streaming("kimi-k2", text, expected)


def test_arguments_round_trip() -> None:
    args = {"path": "a/b.py", "lines": [1, 2], "opts": {"x": None}}
    text = _wrap(_tool("functions.read_file:3", json.dumps(args)))
    check_streaming("kimi-k2", text, [ToolCall("read_file", args)], tries=3)
