"""Every tool-call family end to end, on each of the three APIs, streamed and not.

One stack holds a sim model per family; its folder carries the family's public chat
template (``family_models``), and its script makes it reply with a tool call in the
family's own markup (``workers/sim_script.py``). Each API must return that call in its
own shape (OpenAI ``tool_calls``, Anthropic ``tool_use``, Responses ``function_call``)
and the text before it, with no markup left in the text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from deploy.config import IndexConfig, ModelConfig
from router.tool_parsers import FAMILIES
from tests.router.tool_parsers.family_models import family_model_dir
from tests.stacks import deployed, redis_url, stack_config

pytestmark = pytest.mark.slow
ARGS = {"city": "Paris"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Current weather of a city"
ASK = "What is the weather in Paris? KVFAMILY"
REPLIES = {  # each family's tool call as its model writes it, after the text "Checking."
    "hermes": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
              "\n</tool_call>",
    "qwen3-coder": "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                   "</parameter>\n</function>\n</tool_call>",
    "gpt-oss": "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>"
               'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
               "<|call|>",
    "deepseek-v3.1": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v3.2": 'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                     '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                     "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "glm-4.5": "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
               "<arg_value>Paris</arg_value>\n</tool_call>",
    "kimi-k2": "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
               "<|tool_calls_section_end|>",
    # MiniMax-M2's prompt opens <think>: the reply closes it first.
    "minimax-m2": "The user wants the weather.\n</think>\n\nChecking.\n<minimax:tool_call>\n"
                  '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  "</invoke>\n</minimax:tool_call>",
    "mistral": 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "llama3-json": 'Checking.<|python_tag|>{"name": "get_weather", '
                   '"parameters": {"city": "Paris"}}',
}
FAMILY_NAMES = sorted(REPLIES)
# Each API streams half the families and not the others, a different half per API (so
# each family is streamed on two APIs (the parser sees the engine's token-by-token chunks
# either way: streaming changes only the API's framing, which is the same for all).
CASES = [(f, i % 2 == 0) for i, f in enumerate(FAMILY_NAMES)]
CASES_ODD = [(f, not s) for f, s in CASES]
CASES_HALF = [(f, i < len(FAMILY_NAMES) // 2) for i, f in enumerate(FAMILY_NAMES)]


def test_every_family_is_covered() -> None:
    assert set(REPLIES) == set(FAMILIES)


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("families")
    models = []
    for family, reply in REPLIES.items():
        script = root / f"{family}.json"
        script.write_text(json.dumps({"rules": [{"match": "KVFAMILY", "reply": reply}]}))
        models.append(ModelConfig(
            name=family, engine="sim", model_path=str(family_model_dir(
                tiny_model_dir, family, root / family)),
            num_replicas=1, num_cpus=0.05, engine_kwargs={
                "tpot_s": 0.0005, "prefill_tok_s": 1e6, "script_path": str(script)}))
    cfg = stack_config(serve_port, *models, index=IndexConfig(redis_url=redis_url(stack_redis)))
    with deployed(cfg, timeout_s=240) as url:
        yield url


def _clean_text(family: str, text: str | None) -> None:
    """The text before the call, whole, and none of the family's markup."""
    assert text is not None and text.strip().endswith("Checking."), text
    assert FAMILIES[family].start not in text and "<|" not in text and "<｜" not in text


@pytest.mark.parametrize(("family", "stream"), CASES)
def test_openai_chat(stack: str, family: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "messages": [{"role": "user", "content": ASK}],
                   "tools": [{"type": "function", "function": {
                       "name": "get_weather", "description": DESCRIPTION, "parameters": PARAMS}}]}
    if stream:
        chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        text, calls, finish = choice.message.content, choice.message.tool_calls or [], \
            choice.finish_reason
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", ARGS)]
    assert finish == "tool_calls"
    _clean_text(family, text)


@pytest.mark.parametrize(("family", "stream"), CASES_ODD)
def test_anthropic_messages(stack: str, family: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=stack, api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "max_tokens": 256,
                   "messages": [{"role": "user", "content": ASK}],
                   "tools": [{"name": "get_weather", "description": DESCRIPTION,
                              "input_schema": PARAMS}]}
    if stream:
        with client.messages.stream(**kwargs) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kwargs)
    uses = [(b.name, b.input) for b in msg.content if b.type == "tool_use"]
    assert uses == [("get_weather", ARGS)] and msg.stop_reason == "tool_use"
    _clean_text(family, "".join(b.text for b in msg.content if b.type == "text"))


@pytest.mark.parametrize(("family", "stream"), CASES_HALF)
def test_openai_responses(stack: str, family: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "input": ASK, "tools": [{
        "type": "function", "name": "get_weather", "description": DESCRIPTION,
        "parameters": PARAMS}]}
    if stream:
        events = list(client.responses.create(**kwargs, stream=True))
        resp = next(e.response for e in events if e.type == "response.completed")
    else:
        resp = client.responses.create(**kwargs)
    calls = [(o.name, json.loads(o.arguments)) for o in resp.output if o.type == "function_call"]
    assert calls == [("get_weather", ARGS)]
    _clean_text(family, resp.output_text)
