"""Every tool-call family end to end, on each of the three APIs, streamed and not.

One stack (``conftest.stack``, shared with the reasoning test) holds a sim model per
family; its folder carries the family's public chat template (``family_models``), and
its script makes it reply with a tool call in the family's own markup
(``workers/engines/sim/script.py``). Each API must return that call in its
own shape (OpenAI ``tool_calls``, Anthropic ``tool_use``, Responses ``function_call``)
and the text before it, with no markup left in the text.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from router.output.tool_parsers import FAMILIES
from tests.router.output.tool_parsers.family_stack import ASK, REPLIES

pytestmark = pytest.mark.slow
ARGS = {"city": "Paris"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Current weather of a city"
FAMILY_NAMES = sorted(REPLIES)
# Each API streams half the families and not the others, a different half per API (so
# each family is streamed on two APIs (the parser sees the engine's token-by-token chunks
# either way: streaming changes only the API's framing, which is the same for all).
CASES = [(f, i % 2 == 0) for i, f in enumerate(FAMILY_NAMES)]
CASES_ODD = [(f, not s) for f, s in CASES]
CASES_HALF = [(f, i < len(FAMILY_NAMES) // 2) for i, f in enumerate(FAMILY_NAMES)]


def test_every_family_is_covered() -> None:
    assert set(REPLIES) == set(FAMILIES)


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


def test_a_turn_ending_in_a_tool_call_keeps_its_short_lease(stack: str) -> None:
    """router.routing.leases by_ending: a reply with a tool call (each API counts it) keeps the
    lease its request was sent with; a final answer is renewed with the user-pause one."""
    import httpx

    from tests.stacks import counter

    tool = {"name": "get_weather", "description": DESCRIPTION}
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": ASK}],
                                 "tools": [{"type": "function",
                                            "function": {**tool, "parameters": PARAMS}}]},
        "/v1/messages": {"max_tokens": 256, "messages": [{"role": "user", "content": ASK}],
                         "tools": [{**tool, "input_schema": PARAMS}]},
        "/v1/responses": {"input": ASK, "tools": [{"type": "function", **tool,
                                                    "parameters": PARAMS}]},
    }
    before = counter(stack, "kvroute_lease_renewals_total")
    for path, body in bodies.items():
        r = httpx.post(f"{stack}{path}", json={"model": "hermes", **body}, timeout=60,
                       headers={"x-session-id": f"lease-{path}"})
        assert r.status_code == 200 and "get_weather" in r.text, r.text
    assert counter(stack, "kvroute_lease_renewals_total") == before
    r = httpx.post(f"{stack}/v1/chat/completions", timeout=60,
                   headers={"x-session-id": "lease-final"},
                   json={"model": "hermes", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "Just say hi."}]})
    assert r.status_code == 200, r.text
    assert counter(stack, "kvroute_lease_renewals_total") == before + 1
