"""deepseek-v3.1 on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_deepseekv31_tool_parser.py (Apache-2.0,
vllm-project/vllm), model deepseek-ai/DeepSeek-V3.1; the V3 form from vLLM's
deepseekv3_tool_parser.py docstring.
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

FOO = '<｜tool▁call▁begin｜>foo<｜tool▁sep｜>{"x":1}<｜tool▁call▁end｜>'
BAR = '<｜tool▁call▁begin｜>bar<｜tool▁sep｜>{"y":2}<｜tool▁call▁end｜>'
BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


@pytest.mark.parametrize(("text", "expected"), [
    ("normal text" + BEGIN + FOO + END, ["normal text", ToolCall("foo", {"x": 1})]),
    ("some prefix text" + BEGIN + FOO + BAR + END + " some suffix text",
     ["some prefix text", ToolCall("foo", {"x": 1}), ToolCall("bar", {"y": 2}),
      "some suffix text"]),
    # Cut off part way through the block, or without call markers: text, unchanged.
    ("Let me look that up.<｜tool▁calls▁begin｜>get_weather",
     ["Let me look that up.<｜tool▁calls▁begin｜>get_weather"]),
    ('<｜tool▁calls▁begin｜>foo<｜tool▁sep｜>{"x":1}<｜tool▁calls▁end｜>',
     ['<｜tool▁calls▁begin｜>foo<｜tool▁sep｜>{"x":1}<｜tool▁calls▁end｜>']),
    (BEGIN + '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Oslo"}'
     "\n```<｜tool▁call▁end｜>" + END, [ToolCall("get_weather", {"city": "Oslo"})]),
])
def test_recorded_outputs(text: str, expected: Expected) -> None:
    check_streaming("deepseek-v3.1", text, expected)
