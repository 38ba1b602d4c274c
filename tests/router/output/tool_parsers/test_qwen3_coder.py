"""qwen3-coder on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_qwen3coder_tool_parser.py (Apache-2.0,
vllm-project/vllm), model Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8.
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "state": {"type": "string"},
    "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}}}
AREA = {"type": "object", "properties": {
    "shape": {"type": "string"}, "dimensions": {"type": "object"},
    "precision": {"type": "integer"}}}
SCHEMAS = {"get_current_weather": WEATHER, "calculate_area": AREA}

DALLAS = """<tool_call>
<function=get_current_weather>
<parameter=city>
Dallas
</parameter>
<parameter=state>
TX
</parameter>
<parameter=unit>
fahrenheit
</parameter>
</function>
</tool_call>"""
ORLANDO = DALLAS.replace("Dallas", "Orlando").replace("TX", "FL")
RECTANGLE = """<tool_call>
<function=calculate_area>
<parameter=shape>
rectangle
</parameter>
<parameter=dimensions>
{"width": 10,\x20
 "height": 20}
</parameter>
<parameter=precision>
2
</parameter>
</function>
</tool_call>"""
CIRCLE = """Let me calculate that area for you.<tool_call>
<function=calculate_area>
<parameter=shape>
circle
</parameter>
<parameter=dimensions>
{"radius": 15.5}
</parameter>
<parameter=precision>
3
</parameter>
</function>
</tool_call>"""
TYPES = """<tool_call>
<function=test_types>
<parameter=int_param>
42
</parameter>
<parameter=float_param>
3.14
</parameter>
<parameter=bool_param>
true
</parameter>
<parameter=str_param>
hello world
</parameter>
<parameter=obj_param>
{"key": "value"}
</parameter>
</function>
</tool_call>"""
TYPES_SCHEMA = {"test_types": {"type": "object", "properties": {
    "int_param": {"type": "integer"}, "float_param": {"type": "float"},
    "bool_param": {"type": "boolean"}, "str_param": {"type": "string"},
    "obj_param": {"type": "object"}}}}

DALLAS_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}


@pytest.mark.parametrize(("text", "expected"), [
    (DALLAS, [ToolCall("get_current_weather", DALLAS_ARGS)]),
    ("Sure! Let me check the weather for you." + DALLAS,
     ["Sure! Let me check the weather for you.", ToolCall("get_current_weather", DALLAS_ARGS)]),
    (RECTANGLE, [ToolCall("calculate_area", {"shape": "rectangle",
                                             "dimensions": {"width": 10, "height": 20},
                                             "precision": 2})]),
    (DALLAS + "\n" + ORLANDO,
     [ToolCall("get_current_weather", DALLAS_ARGS),
      ToolCall("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})]),
    (CIRCLE, ["Let me calculate that area for you.",
              ToolCall("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5},
                                          "precision": 3})]),
    ("This is a test response without any tool calls",
     ["This is a test response without any tool calls"]),
    # Cut by max_tokens inside a parameter: not a call, the text comes back unchanged.
    (DALLAS[:60], [DALLAS[:60]]),
    # Without the <tool_call> wrapper (vLLM's test_extract_tool_calls_fallback_no_tags).
    (DALLAS[len("<tool_call>\n"):-len("\n</tool_call>")],
     [ToolCall("get_current_weather", DALLAS_ARGS)]),
    ("Sure. " + DALLAS[len("<tool_call>\n"):-len("\n</tool_call>")] + " Done.",
     ["Sure.", ToolCall("get_current_weather", DALLAS_ARGS), "Done."]),
    ("a <function=f> without its close", ["a <function=f> without its close"]),
])
def test_recorded_outputs(text: str, expected: Expected) -> None:
    check_streaming("qwen3-coder", text, expected, SCHEMAS)


def test_values_are_typed_by_the_tools_schema() -> None:
    check_streaming("qwen3-coder", TYPES, [ToolCall("test_types", {
        "int_param": 42, "float_param": 3.14, "bool_param": True, "str_param": "hello world",
        "obj_param": {"key": "value"}})], TYPES_SCHEMA)
    # Without a schema (an undeclared tool) every value stays the text the model wrote.
    check_streaming("qwen3-coder", TYPES, [ToolCall("test_types", {
        "int_param": "42", "float_param": "3.14", "bool_param": "true",
        "str_param": "hello world", "obj_param": '{"key": "value"}'})], tries=3)
    # A declared integer that is not one stays text rather than being lost.
    bad = TYPES.replace("\n42\n", "\nforty-two\n")
    check_streaming("qwen3-coder", bad, [ToolCall("test_types", {
        "int_param": "forty-two", "float_param": 3.14, "bool_param": True,
        "str_param": "hello world", "obj_param": {"key": "value"}})], TYPES_SCHEMA, tries=3)
