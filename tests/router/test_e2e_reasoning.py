"""Reasoning end to end: every thinking family on each of the three APIs, streamed and
not, and the prefix reuse of a second turn that sends the reasoning back.

One stack holds a sim model per family; its folder carries the family's public chat
template (``tests/router/test_reasoning_templates.model_dir``) and its script makes it
answer in the family's own markup: reasoning, then an answer or a tool call
(``workers/sim_script.py``). Each API must return the reasoning in its own shape
(chat ``reasoning_content``, Anthropic ``thinking`` blocks, Responses ``reasoning``
items), the answer or the call apart from it, and no markup in either. Every request
asks for reasoning (``reasoning_effort``, ``thinking``, ``reasoning.effort``): DeepSeek's
template opens ``<think>`` only then.

The turn-2 figure (``pytest -s``): Qwen3's template behind a 2k-token system prompt,
turn 1 answered with ``<think>…</think>answer``, turn 2 sends it back (with its
reasoning) plus a new question; the engine's own cached-token count over turn 1's
prompt. The sim caches prompt blocks only (64 tokens), not decoded tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from deploy.config import ModelConfig
from tests.router.test_reasoning_templates import FAMILIES, model_dir
from tests.stacks import deployed, stack_config

pytestmark = pytest.mark.slow
THOUGHT, ANSWER = "I should check the weather tool.", "Sunny in Paris."
CALL = ("get_weather", {"city": "Paris"})
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
DESCRIPTION = "Current weather of a city"  # gpt-oss's template needs one
ARGS = json.dumps(CALL[1])
# family → (its answer after reasoning, its tool call after reasoning), as it writes them.
REPLIES = {
    "qwen3": (f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}",
              f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>\n"
              f'{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'),
    "deepseek-v3.1": (f"{THOUGHT}</think>{ANSWER}",  # the prompt opened <think>
                      f"{THOUGHT}</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                      f"<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "glm-4.5": (f"\n<think>{THOUGHT}</think>\n{ANSWER}",
                f"\n<think>{THOUGHT}</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                "<arg_value>Paris</arg_value>\n</tool_call>"),
    "minimax-m2": (f"{THOUGHT}\n</think>\n\n{ANSWER}",  # the prompt opened <think>
                   f"{THOUGHT}\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                   '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>'),
    "kimi-k2": (f"<think>{THOUGHT}</think>{ANSWER}",
                f"<think>{THOUGHT}</think><|tool_calls_section_begin|><|tool_call_begin|>"
                f"functions.get_weather:0<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>"
                "<|tool_calls_section_end|>"),
    "gpt-oss": (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>{ANSWER}",
                f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>"
                f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}"
                "<|call|>"),
}
# In the stack (its start-up is most of this module's time): one family per parser
# behaviour. GLM-4.5 writes Qwen3's markup and MiniMax-M2 DeepSeek's (a prompt that
# opened <think>); the parser and template tests cover both, and the tool-call
# families' end-to-end test runs MiniMax-M2's reasoning through a stack.
NAMES = ["deepseek-v3.1", "gpt-oss", "kimi-k2", "qwen3"]
SYSTEM = " ".join(f"rule{i} keep answers short." for i in range(500))  # ~2k tokens


def test_every_thinking_family_is_covered() -> None:
    assert set(REPLIES) == set(FAMILIES)


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("thinking")
    models = []
    for family in NAMES:
        answer, call = REPLIES[family]
        script = root / f"{family}.json"
        script.write_text(json.dumps({"rules": [{"match": "KVTOOL", "reply": call},
                                                {"match": "KVTHINK", "reply": answer}]}))
        path = model_dir(tiny_model_dir, FAMILIES[family][0], root / family)
        models.append(ModelConfig(
            name=family, engine="sim", model_path=str(path), num_replicas=1, num_cpus=0.05,
            engine_kwargs={"tpot_s": 0.0005, "prefill_tok_s": 1e6, "script_path": str(script)}))
    with deployed(stack_config(serve_port, *models), timeout_s=240) as url:
        yield url


def _clean(text: str) -> None:
    assert "<think>" not in text and "</think>" not in text and "<|" not in text, text


def _chat(url: str, family: str, ask: str, stream: bool, **extra: Any
          ) -> tuple[str, str, list[Any], Any]:
    """(reasoning, answer, tool calls, usage) from /v1/chat/completions."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "reasoning_effort": "high", **extra,
                   "messages": extra.get("messages", [{"role": "user", "content": ask}])}
    kwargs["tools"] = [{"type": "function", "function": {"name": "get_weather",
                                                         "description": DESCRIPTION,
                                                         "parameters": PARAMS}}]
    if not stream:
        resp = client.chat.completions.create(**kwargs)
        msg = resp.choices[0].message
        reasoning = (msg.model_extra or {}).get("reasoning_content") or ""
        return reasoning, msg.content or "", list(msg.tool_calls or []), resp.usage
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or []]
    return reasoning, "".join(d.content or "" for d in deltas), calls, chunks[-1].usage


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", NAMES)
def test_openai_chat(stack: str, family: str, stream: bool) -> None:
    reasoning, text, calls, _ = _chat(stack, family, "Weather? KVTHINK", stream)
    assert (reasoning, text.strip(), calls) == (THOUGHT, ANSWER, [])
    reasoning, text, calls, _ = _chat(stack, family, "Weather? KVTOOL", stream)
    assert reasoning == THOUGHT and text.strip() == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [CALL]


def _anthropic(url: str, family: str, messages: list[dict[str, Any]], stream: bool) -> Any:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "max_tokens": 256, "messages": messages, "system": SYSTEM,
                   "thinking": {"type": "enabled", "budget_tokens": 1024},
                   "tools": [{"name": "get_weather", "description": DESCRIPTION,
                              "input_schema": PARAMS}]}
    if stream:
        with client.messages.stream(**kwargs) as s:
            return s.get_final_message()
    return client.messages.create(**kwargs)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", NAMES)
def test_anthropic_messages(stack: str, family: str, stream: bool) -> None:
    msg = _anthropic(stack, family, [{"role": "user", "content": "Weather? KVTHINK"}], stream)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == THOUGHT and msg.content[1].text.strip() == ANSWER
    msg = _anthropic(stack, family, [{"role": "user", "content": "Weather? KVTOOL"}], stream)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    assert (msg.content[1].name, msg.content[1].input) == CALL
    assert msg.stop_reason == "tool_use"


def _responses(url: str, family: str, items: Any, stream: bool) -> Any:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": family, "input": items, "instructions": SYSTEM, "store": False,
                   "reasoning": {"effort": "high"},
                   "tools": [{"type": "function", "name": "get_weather", "description": DESCRIPTION,
                              "parameters": PARAMS}]}
    if not stream:
        return client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    return next(e.response for e in events if e.type == "response.completed")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", NAMES)
def test_openai_responses(stack: str, family: str, stream: bool) -> None:
    resp = _responses(stack, family, "Weather? KVTHINK", stream)
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == THOUGHT and resp.output_text.strip() == ANSWER
    resp = _responses(stack, family, "Weather? KVTOOL", stream)
    assert [o.type for o in resp.output] == ["reasoning", "function_call"]
    assert (resp.output[1].name, json.loads(resp.output[1].arguments)) == CALL
    _clean(resp.output_text)


def _report(api: str, prompt1: int, prompt2: int, cached2: int) -> None:
    print(f"\nTURN2 qwen3 {api}: turn-1 prompt {prompt1}, turn-2 prompt {prompt2}, turn-2 "
          f"cached {cached2} = {cached2 / prompt1:.1%} of turn 1's prompt")
    assert cached2 >= 0.8 * prompt1


def test_turn_two_reuses_turn_one_with_reasoning_sent_back(stack: str) -> None:
    """Each API, two turns on Qwen3's template; the reasoning goes back as each API sends it."""
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "Weather? KVTHINK"}]
    r, text, _, u1 = _chat(stack, "qwen3", "", False, messages=first)
    second = [*first, {"role": "assistant", "content": text, "reasoning_content": r},
              {"role": "user", "content": "And tomorrow? KVTHINK"}]
    *_, u2 = _chat(stack, "qwen3", "", False, messages=second)
    _report("chat", u1.prompt_tokens, u2.prompt_tokens, u2.prompt_tokens_details.cached_tokens)

    turn1 = [{"role": "user", "content": "Weather here? KVTHINK"}]
    m1 = _anthropic(stack, "qwen3", turn1, False)
    turn2 = [*turn1, {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
             {"role": "user", "content": "And tomorrow? KVTHINK"}]
    m2 = _anthropic(stack, "qwen3", turn2, False)
    p1 = m1.usage.input_tokens + m1.usage.cache_read_input_tokens
    _report("anthropic", p1, m2.usage.input_tokens + m2.usage.cache_read_input_tokens,
            m2.usage.cache_read_input_tokens)

    items: list[Any] = [{"role": "user", "content": "Weather there? KVTHINK"}]
    r1 = _responses(stack, "qwen3", items, False)
    items += [o.model_dump(exclude_none=True) for o in r1.output]
    items.append({"role": "user", "content": "And tomorrow? KVTHINK"})
    r2 = _responses(stack, "qwen3", items, False)
    _report("responses", r1.usage.input_tokens, r2.usage.input_tokens,
            r2.usage.input_tokens_details.cached_tokens)


def test_a_tool_loop_then_a_new_question(stack: str) -> None:
    """Qwen3's template renders a tool loop's reasoning while the loop runs and drops it
    once a new user message comes: every turn in the loop reuses the previous prompt;
    the turn after the new question reuses only what came before the loop."""
    result = " ".join(f"reading{i} 21 C" for i in range(300))  # a ~1.2k-token tool result
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Weather in three cities? KVTOOL"}]
    prompts, cached = [], []
    for turn in range(4):
        reasoning, _, calls, usage = _chat(stack, "qwen3", "", False, messages=msgs)
        prompts.append(usage.prompt_tokens)
        cached.append(usage.prompt_tokens_details.cached_tokens)
        if turn == 3:
            break
        call = {"id": calls[0].id, "type": "function", "function": {
            "name": calls[0].function.name, "arguments": calls[0].function.arguments}}
        msgs += [{"role": "assistant", "content": "", "reasoning_content": reasoning,
                  "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": calls[0].id, "content": result}]
        if turn == 2:  # the loop ends; the user asks again
            msgs += [{"role": "assistant", "content": "Done."},
                     {"role": "user", "content": "And tomorrow? KVTOOL"}]
    for n in range(1, 4):
        print(f"\nTOOL-LOOP qwen3 turn {n + 1}: prompt {prompts[n]}, cached {cached[n]} = "
              f"{cached[n] / prompts[n - 1]:.1%} of turn {n}'s prompt {prompts[n - 1]}")
    assert cached[1] >= 0.8 * prompts[0] and cached[2] >= 0.8 * prompts[1]
    assert cached[3] <= prompts[0]  # the loop's reasoning is gone from the prompt
