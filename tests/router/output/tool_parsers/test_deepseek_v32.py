"""deepseek-v3.2 (DSML) on recorded outputs.

Outputs from vLLM's tests/tool_parsers/test_deepseekv32_tool_parser.py (Apache-2.0,
vllm-project/vllm), model deepseek-ai/DeepSeek-V3.2.
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming

FC_START, FC_END = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
INV_START, INV_END = '<｜DSML｜invoke name="', "</｜DSML｜invoke>"
PARAM_START, PARAM_END = '<｜DSML｜parameter name="', "</｜DSML｜parameter>"


def build(name: str, params: dict[str, str], string: str = "true") -> str:
    ps = "".join(f'{PARAM_START}{k}" string="{string}">{v}{PARAM_END}' for k, v in params.items())
    return f'{FC_START}\n{INV_START}{name}">\n{ps}\n{INV_END}\n{FC_END}'


TWO = (f'{FC_START}\n{INV_START}get_weather">\n{PARAM_START}location" string="true">SF'
       f'{PARAM_END}\n{INV_END}\n{INV_START}get_weather">\n{PARAM_START}location" '
       f'string="true">NYC{PARAM_END}\n{INV_END}\n{FC_END}')
TOGGLE = {"toggle": {"type": "object", "properties": {
    "enabled": {"type": "boolean"}, "count": {"type": "integer"}}}}


@pytest.mark.parametrize(("text", "schemas", "expected"), [
    ("just some text", None, ["just some text"]),
    (f'{FC_START}\n{INV_START}get_time">\n{INV_END}\n{FC_END}', None, [ToolCall("get_time", {})]),
    (build("get_weather", {"location": "SF", "date": "2024-01-16"}), None,
     [ToolCall("get_weather", {"location": "SF", "date": "2024-01-16"})]),
    ("Sure, let me check! " + build("get_weather", {"location": "NYC"}), None,
     ["Sure, let me check!", ToolCall("get_weather", {"location": "NYC"})]),
    (TWO, None, [ToolCall("get_weather", {"location": "SF"}),
                 ToolCall("get_weather", {"location": "NYC"})]),
    (build("toggle", {"enabled": "true", "count": "42"}, "false"), TOGGLE,
     [ToolCall("toggle", {"enabled": True, "count": 42})]),
    (build("toggle", {"enabled": "true", "count": "42"}, "false"), None,  # JSON, says the model
     [ToolCall("toggle", {"enabled": True, "count": 42})]),
    (build("update", {"tags": '["a", "b"]', "meta": '{"k": 1}'}, "false"), None,
     [ToolCall("update", {"tags": ["a", "b"], "meta": {"k": 1}})]),
    (build("get_weather", {"location": "SF"})[:-20], None,
     [build("get_weather", {"location": "SF"})[:-20]]),
])
def test_recorded_outputs(text: str, schemas: dict | None, expected: Expected) -> None:
    check_streaming("deepseek-v3.2", text, expected, schemas)
