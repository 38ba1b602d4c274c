"""Structured outputs end to end on mlx (two CPU replicas of the random-weight tiny model,
the same stack as test_agents): the openai SDK's JSON-schema requests, streamed and not,
come back as JSON valid against each of 20 schemas; vLLM's ``structured_outputs`` and
``guided_choice`` constrain the same way; a forced tool call (required, named) comes back
as a parsed call with schema-valid arguments, on chat and on Anthropic's Messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from deploy.config import ModelConfig
from tests.stacks import deployed, shared_index, stack_config
from tests.workers.engines.structured_cases import MAX_TOKENS, SCHEMAS

pytestmark = [pytest.mark.slow, pytest.mark.stack("mlx-pair")]
MODEL = "tiny-llama"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
          "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int
          ) -> Iterator[str]:
    model = ModelConfig(name=MODEL, engine="mlx", model_path=str(tiny_model_dir),
                        num_replicas=2, num_cpus=0.5)  # as test_agents: one start for both
    index = shared_index(stack_redis)  # test_agents' config: the pool keeps its app
    with deployed(stack_config(serve_port, model, index=index), timeout_s=300) as url:
        yield url


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _text(client: openai.OpenAI, stream: bool, **kw: Any) -> tuple[str, str | None]:
    kw = {"model": MODEL, "max_tokens": MAX_TOKENS,
          "messages": [{"role": "user", "content": "Answer in JSON."}], **kw}
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        return choice.message.content or "", choice.finish_reason
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), \
        chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_twenty_schemas_validate(stack: str, stream: bool) -> None:
    client = _openai(stack)
    for i, schema in enumerate(SCHEMAS):
        text, finish = _text(client, stream, seed=i, temperature=1.0 if i % 2 else 0.0,
                             response_format={"type": "json_schema", "json_schema": {
                                 "name": f"s{i}", "schema": schema, "strict": i % 3 == 0}})
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_vllm_structured_outputs_and_guided_names(stack: str) -> None:
    client = _openai(stack)
    text, _ = _text(client, False, extra_body={"structured_outputs": {"regex": "[a-d]{4}"}})
    assert len(text) == 4 and set(text) <= set("abcd")
    text, _ = _text(client, True, extra_body={"guided_choice": ["left", "right"]})
    assert text in ("left", "right")
    r = client.completions.create(model=MODEL, prompt="Colour:", max_tokens=8,
                                  extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert r.choices[0].text in ("red", "blue")


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_parse(stack: str, stream: bool) -> None:
    client = _openai(stack)
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
                  {"type": "function", "function": {"name": "noop", "parameters": {
                      "type": "object", "properties": {}, "additionalProperties": False}}}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        kw: Any = {"model": MODEL, "max_tokens": 96, "tools": tools, "tool_choice": choice,
                   "parallel_tool_calls": False,
                   "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        if stream:
            chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
            calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
            name = calls[0].function.name
            args = "".join(t.function.arguments or "" for t in calls)
            finish = chunks[-1].choices[0].finish_reason
        else:
            out = client.chat.completions.create(**kw).choices[0]
            assert out.message.tool_calls and len(out.message.tool_calls) == 1
            name, args = out.message.tool_calls[0].function.name, \
                out.message.tool_calls[0].function.arguments
            finish = out.finish_reason
        assert finish == "tool_calls"
        assert name == "get_weather" or (choice == "required" and name == "noop")
        jsonschema.validate(json.loads(args), PARAMS if name == "get_weather" else {})
    with pytest.raises(openai.BadRequestError) as err:  # vLLM's 400 for an unknown name
        client.chat.completions.create(
            model=MODEL, max_tokens=8, tools=tools, messages=[{"role": "user", "content": "x"}],
            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_anthropic_tool_choice_tool_is_forced(stack: str) -> None:
    client = anthropic.Anthropic(base_url=stack, api_key="unused", max_retries=0, timeout=120)
    msg = client.messages.create(
        model=MODEL, max_tokens=96, messages=[{"role": "user", "content": "Weather?"}],
        tools=[{"name": "get_weather", "input_schema": PARAMS}],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
    jsonschema.validate(uses[0].input, PARAMS)
