"""Reasoning end to end: every thinking family on each of the three APIs, and the
prefix reuse of later turns that send the reasoning back.

The families' shared stack (``conftest.stack``, ``family_stack``): each sim model has
its family's public chat template and answers ``KVREASON-ANSWER`` / ``KVREASON-TOOL``
with reasoning in its family's markup, then an answer or a tool call. Each API must
return the reasoning in its own shape (chat ``reasoning_content``, Anthropic
``thinking`` blocks, Responses ``reasoning`` items), the answer or the call apart from
it, and no markup in either; each API streams half the families. Every request asks
for reasoning (``reasoning_effort``, ``thinking``, ``reasoning.effort``): DeepSeek's
template opens ``<think>`` only then. Kimi-K2's model has the Instruct template (which
does not think) and ``reasoning_parser: kimi-k2`` set: the config's override.

The turn-2 figures (``pytest -s``) use Qwen3's template (the ``hermes`` model): the
engine's own cached-token count over the previous turn's prompt. The sim caches whole
64-token prompt blocks, not decoded tokens.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from router.output.reasoning_parsers import SPECS
from tests.router.output.tool_parsers.family_stack import ANSWER, THINKING, THOUGHT

pytestmark = pytest.mark.slow
CALL = ("get_weather", {"city": "Paris"})
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
DESCRIPTION = "Current weather of a city"  # gpt-oss's template needs one
QWEN3 = "hermes"  # the model with Qwen3's template
NAMES = sorted(THINKING)
CASES = [(f, i % 2 == 0) for i, f in enumerate(NAMES)]
CASES_ODD = [(f, not s) for f, s in CASES]
CASES_HALF = [(f, i < len(NAMES) // 2) for i, f in enumerate(NAMES)]
SYSTEM = " ".join(f"rule{i} keep answers short." for i in range(500))  # ~5.6k tokens


def test_every_thinking_family_is_covered() -> None:
    # DeepSeek-R1 writes V3.1's markup; its recorded outputs are in the parser test.
    formats = {QWEN3: "qwen3", "deepseek-v3.2": "deepseek-v3.1"}
    assert {formats.get(m, m) for m in THINKING} == set(SPECS) - {"deepseek-r1"}


def _chat(url: str, model: str, messages: list[dict[str, Any]], stream: bool
          ) -> tuple[str, str, list[Any], Any]:
    """(reasoning, answer, tool calls, usage) from /v1/chat/completions."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": model, "reasoning_effort": "high", "messages": messages,
                   "tools": [{"type": "function", "function": {
                       "name": "get_weather", "description": DESCRIPTION,
                       "parameters": PARAMS}}]}
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


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(("model", "stream"), CASES)
def test_openai_chat(stack: str, model: str, stream: bool) -> None:
    reasoning, text, calls, _ = _chat(stack, model, _ask("Weather? KVREASON-ANSWER"), stream)
    assert (reasoning, text.strip(), calls) == (THOUGHT, ANSWER, [])
    reasoning, text, calls, _ = _chat(stack, model, _ask("Weather? KVREASON-TOOL"), stream)
    assert reasoning == THOUGHT and text.strip() == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [CALL]


def _anthropic(url: str, model: str, messages: list[dict[str, Any]], stream: bool) -> Any:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    kwargs: Any = {"model": model, "max_tokens": 256, "messages": messages, "system": SYSTEM,
                   "thinking": {"type": "enabled", "budget_tokens": 1024},
                   "tools": [{"name": "get_weather", "description": DESCRIPTION,
                              "input_schema": PARAMS}]}
    if stream:
        with client.messages.stream(**kwargs) as s:
            return s.get_final_message()
    return client.messages.create(**kwargs)


@pytest.mark.parametrize(("model", "stream"), CASES_ODD)
def test_anthropic_messages(stack: str, model: str, stream: bool) -> None:
    msg = _anthropic(stack, model, _ask("Weather? KVREASON-ANSWER"), stream)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == THOUGHT and msg.content[1].text.strip() == ANSWER
    msg = _anthropic(stack, model, _ask("Weather? KVREASON-TOOL"), stream)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    assert (msg.content[1].name, msg.content[1].input) == CALL
    assert msg.stop_reason == "tool_use"


def _responses(url: str, model: str, items: Any, stream: bool) -> Any:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    kwargs: Any = {"model": model, "input": items, "instructions": SYSTEM, "store": False,
                   "reasoning": {"effort": "high"},
                   "tools": [{"type": "function", "name": "get_weather",
                              "description": DESCRIPTION, "parameters": PARAMS}]}
    if not stream:
        return client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    return next(e.response for e in events if e.type == "response.completed")


@pytest.mark.parametrize(("model", "stream"), CASES_HALF)
def test_openai_responses(stack: str, model: str, stream: bool) -> None:
    resp = _responses(stack, model, "Weather? KVREASON-ANSWER", stream)
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == THOUGHT and resp.output_text.strip() == ANSWER
    resp = _responses(stack, model, "Weather? KVREASON-TOOL", stream)
    assert [o.type for o in resp.output] == ["reasoning", "function_call"]
    assert (resp.output[1].name, json.loads(resp.output[1].arguments)) == CALL
    assert "<|" not in resp.output_text and "think>" not in resp.output_text


def _report(api: str, prompt1: int, prompt2: int, cached2: int) -> None:
    print(f"\nTURN2 qwen3 template, {api}: turn-1 prompt {prompt1}, turn-2 prompt {prompt2}, "
          f"turn-2 cached {cached2} = {cached2 / prompt1:.1%} of turn 1's prompt")
    assert cached2 >= 0.8 * prompt1


def test_turn_two_reuses_turn_one_with_reasoning_sent_back(stack: str) -> None:
    """Each API, two turns on Qwen3's template; the reasoning goes back as each API sends it."""
    first = [{"role": "system", "content": SYSTEM}, *_ask("Weather? KVREASON-ANSWER")]
    r, text, _, u1 = _chat(stack, QWEN3, first, False)
    second = [*first, {"role": "assistant", "content": text, "reasoning_content": r},
              *_ask("And tomorrow? KVREASON-ANSWER")]
    *_, u2 = _chat(stack, QWEN3, second, False)
    _report("chat", u1.prompt_tokens, u2.prompt_tokens, u2.prompt_tokens_details.cached_tokens)

    turn1 = _ask("Weather here? KVREASON-ANSWER")
    m1 = _anthropic(stack, QWEN3, turn1, False)
    turn2 = [*turn1, {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
             *_ask("And tomorrow? KVREASON-ANSWER")]
    m2 = _anthropic(stack, QWEN3, turn2, False)
    p1 = m1.usage.input_tokens + m1.usage.cache_read_input_tokens
    _report("anthropic", p1, m2.usage.input_tokens + m2.usage.cache_read_input_tokens,
            m2.usage.cache_read_input_tokens)

    items: list[Any] = _ask("Weather there? KVREASON-ANSWER")
    r1 = _responses(stack, QWEN3, items, False)
    items += [o.model_dump(exclude_none=True) for o in r1.output]
    items += _ask("And tomorrow? KVREASON-ANSWER")
    r2 = _responses(stack, QWEN3, items, False)
    _report("responses", r1.usage.input_tokens, r2.usage.input_tokens,
            r2.usage.input_tokens_details.cached_tokens)


def test_a_tool_loop_then_a_new_question(stack: str) -> None:
    """Qwen3's template renders a tool loop's reasoning while the loop runs and drops it
    once a new user message comes: every turn in the loop reuses the previous prompt;
    the turn after the new question reuses only what came before the loop."""
    result = " ".join(f"reading{i} 21 C" for i in range(300))  # a ~2.3k-token tool result
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                  *_ask("Weather in three cities? KVREASON-TOOL")]
    prompts, cached = [], []
    for turn in range(4):
        reasoning, _, calls, usage = _chat(stack, QWEN3, msgs, False)
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
                     {"role": "user", "content": "And tomorrow? KVREASON-TOOL"}]
    for n in range(1, 4):
        print(f"\nTOOL-LOOP qwen3 template, turn {n + 1}: prompt {prompts[n]}, cached "
              f"{cached[n]} = {cached[n] / prompts[n - 1]:.1%} of turn {n}'s prompt "
              f"{prompts[n - 1]}")
    assert cached[1] >= 0.8 * prompts[0] and cached[2] >= 0.8 * prompts[1]
    assert cached[3] <= prompts[0]  # the loop's reasoning is gone from the prompt
