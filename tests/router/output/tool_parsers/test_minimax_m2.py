"""minimax-m2 on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_minimax_m2_tool_parser.py (Apache-2.0,
vllm-project/vllm), model MiniMaxAI/MiniMax-M2.
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

SEATTLE = ('<minimax:tool_call><invoke name="get_weather">'
           '<parameter name="city">Seattle</parameter></invoke></minimax:tool_call>')
TWO = ('<minimax:tool_call><invoke name="search_web"><parameter name="query">OpenAI</parameter>'
       '</invoke><invoke name="search_web"><parameter name="query">Gemini</parameter></invoke>'
       "</minimax:tool_call>")
DAYS = ('<minimax:tool_call><invoke name="get_weather"><parameter name="city">Seattle'
        '</parameter><parameter name="days">5</parameter></invoke></minimax:tool_call>')
# The template's own layout: a newline between tags.
TEMPLATED = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
             'Paris</parameter>\n</invoke>\n</minimax:tool_call>')


@pytest.mark.parametrize(("text", "schemas", "expected"), [
    ("Hello world", None, ["Hello world"]),
    ("Let me check. " + SEATTLE, None,
     ["Let me check.", ToolCall("get_weather", {"city": "Seattle"})]),
    (TWO, None, [ToolCall("search_web", {"query": "OpenAI"}),
                 ToolCall("search_web", {"query": "Gemini"})]),
    (DAYS, None, [ToolCall("get_weather", {"city": "Seattle", "days": "5"})]),  # no schema
    (DAYS, {"get_weather": {"type": "object", "properties": {"days": {"type": "integer"}}}},
     [ToolCall("get_weather", {"city": "Seattle", "days": 5})]),
    (TEMPLATED, None, [ToolCall("get_weather", {"city": "Paris"})]),
    (SEATTLE[:-30], None, [SEATTLE[:-30]]),  # cut short: text back
])
def test_recorded_outputs(text: str, schemas: dict | None, expected: Expected) -> None:
    check_streaming("minimax-m2", text, expected, schemas)
