"""Each family's public chat template rendered through kvroute's template path (the
OpenAI request's template messages and tools, ``ChatTokenizer.render``) with tools, a
past tool call and its result; the past call, as the template writes it, parses back
with the family's own parser (the template teaches the model the format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.api.openai.schema import ChatCompletionRequest
from router.output.tool_calls import family_for_model, schemas
from router.output.tool_parsers import ToolCall, make_parser
from router.prompt.tokenizer import ChatTokenizer
from tests.router.output.tool_parsers.family_models import TEMPLATE_OF, family_model_dir

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CALL_ID = "abc123def"  # Mistral's templates refuse any id but 9 letters and digits
BODY: dict[str, Any] = {"model": "m", "tools": TOOLS, "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": CALL_ID, "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather",
     "content": "18 degrees and sunny"},
]}
# mistral's section runs to the end of the output, so in a whole prompt it cannot close;
# Llama 3.1's template writes past calls as bare JSON, a call only at the output's start.
ROUND_TRIP = set(TEMPLATE_OF) - {"mistral", "llama3-json"}
# DeepSeek-V3.1's own template does not list the tools (vLLM ships one that does).
NO_TOOL_LIST = {"deepseek-v3.1"}


@pytest.mark.parametrize("family", sorted(TEMPLATE_OF))
def test_template_renders_tools_calls_and_results(
        family: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = family_model_dir(tiny_model_dir, family, tmp_path / family)
    assert family_for_model(str(folder)) == family
    req = ChatCompletionRequest.model_validate(BODY)
    prompt = ChatTokenizer(str(folder)).render(req.template_messages(), req.template_tools())
    assert ("Current weather of a city" in prompt) is (family not in NO_TOOL_LIST)
    assert "18 degrees and sunny" in prompt
    assert "Paris" in prompt and "Be brief." in prompt
    if family in ROUND_TRIP:
        parser = make_parser(family, schemas(req.template_tools()))
        assert parser is not None
        events = parser.feed(prompt) + parser.flush()
        assert ToolCall("get_weather", {"city": "Paris"}) in events
    else:
        assert any(m in prompt for m in ("[TOOL_CALLS]get_weather[CALL_ID]", '"parameters"'))
