"""glm-4.5 on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_glm4_moe_tool_parser.py (Apache-2.0,
vllm-project/vllm), model zai-org/GLM-4.5.
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

DALLAS = """<tool_call>get_current_weather
    <arg_key>city</arg_key>
    <arg_value>Dallas</arg_value>
    <arg_key>state</arg_key>
    <arg_value>TX</arg_value>
    <arg_key>unit</arg_key>
    <arg_value>fahrenheit</arg_value>
    </tool_call>"""
BEIJING = """<tool_call>get_weather
<arg_key>city</arg_key>
<arg_value>Beijing</arg_value>
<arg_key>date</arg_key>
<arg_value>2025-08-01</arg_value>
</tool_call>"""
MIXED = ("I will help you get the weather info.\n\n" + BEIJING +
         "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n" +
         BEIJING.replace("Beijing", "Shanghai"))
DALLAS_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
BEIJING_ARGS = {"city": "Beijing", "date": "2025-08-01"}


@pytest.mark.parametrize(("text", "expected"), [
    (DALLAS, [ToolCall("get_current_weather", DALLAS_ARGS)]),
    (DALLAS + "\n    " + DALLAS.replace("Dallas", "Orlando").replace("TX", "FL"),
     [ToolCall("get_current_weather", DALLAS_ARGS),
      ToolCall("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})]),
    ("I'll help you check the weather. " + DALLAS,
     ["I'll help you check the weather.", ToolCall("get_current_weather", DALLAS_ARGS)]),
    ("I will help you get the weather." + BEIJING,
     ["I will help you get the weather.", ToolCall("get_weather", BEIJING_ARGS)]),
    ("<tool_call>get_current_time\n</tool_call>", [ToolCall("get_current_time", {})]),
    (MIXED, ["I will help you get the weather info.", ToolCall("get_weather", BEIJING_ARGS),
             "meaningwhile, I will also check the weather in Shanghai.",
             ToolCall("get_weather", {"city": "Shanghai", "date": "2025-08-01"})]),
    # Incomplete (no closing tag, cut by max_tokens) or malformed: given back as text.
    (BEIJING[:-12] + "<arg_key>x", [BEIJING[:-12] + "<arg_key>x"]),
    ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
     "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
     ["<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
      "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>"]),
])
def test_recorded_outputs(text: str, expected: Expected) -> None:
    check_streaming("glm-4.5", text, expected)


def test_values_are_typed_by_the_tools_schema() -> None:
    schemas = {"f": {"type": "object", "properties": {
        "n": {"type": "integer"}, "tags": {"type": "array"}, "s": {"type": "string"}}}}
    text = ("<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n<arg_key>tags"
            '</arg_key>\n<arg_value>["a", "b"]</arg_value>\n<arg_key>s</arg_key>\n'
            "<arg_value>7</arg_value>\n</tool_call>")
    check_streaming("glm-4.5", text, [ToolCall("f", {"n": 7, "tags": ["a", "b"], "s": "7"})],
                    schemas, tries=3)
