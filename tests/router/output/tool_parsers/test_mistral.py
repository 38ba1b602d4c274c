"""mistral on recorded outputs (the v3 JSON list, v11 ``name[ARGS]``, Mistral Small 3.2's
``[CALL_ID]``).

Outputs from vLLM's tests/tool_parsers/test_mistral_tool_parser.py (Apache-2.0,
vllm-project/vllm); the [CALL_ID] form as Mistral-Small-3.2-24B-Instruct-2506's chat
template writes calls (ops/chat_templates).
"""

from __future__ import annotations

import pytest

from router.output.tool_parsers import ToolCall
from tests.router.output.tool_parsers.helpers import Expected, check_streaming


@pytest.mark.parametrize(("text", "expected"), [
    ('[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
     [ToolCall("add", {"a": 3.5, "b": 4})]),
    ('[TOOL_CALLS]add_this_and_that[ARGS]{"a": 3.5, "b": 4}',
     [ToolCall("add_this_and_that", {"a": 3.5, "b": 4})]),
    ('[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
     [ToolCall("add", {"a": 3.5, "b": 4}), ToolCall("multiply", {"a": 3, "b": 6})]),
    ('I will call.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
     ["I will call.", ToolCall("get_weather", {"city": "Paris"})]),
])
def test_recorded_outputs(text: str, expected: Expected) -> None:
    check_streaming("mistral", text, expected)
