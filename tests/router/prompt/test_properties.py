"""Property tests (hypothesis) of normalisation, chat templating and block hashing.

Fast and in-process (no Ray): the tiny model's ChatML template and tokenizer, the
Anthropic normaliser, and ``cache_service.hashing``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cache_service.hashing import HASH_MASK, block_hashes, model_salt
from router.api.anthropic.normalize import system_text, to_chat
from router.api.anthropic.schema import CountTokensRequest, TextBlock
from router.prompt.template import ChatPrompt, strip_volatile
from router.prompt.tokenizer import ChatTokenizer, TemplateRenderError

EXAMPLES = int(os.environ.get("KVROUTE_HYPOTHESIS_EXAMPLES", "150"))  # more: a deeper search
FAST = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_VOLATILE = re.compile(r"x-anthropic-", re.IGNORECASE)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(str(tiny_model_dir))


# --- strategies -----------------------------------------------------------------------------

plain = st.text(max_size=40).filter(lambda t: not _VOLATILE.search(t))
nonblank = plain.filter(lambda t: t.strip() != "")
nonce = st.text("0123456789abcdef", min_size=1, max_size=16)


def billing(n: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch={n};"


text_block = plain.map(lambda t: {"type": "text", "text": t})
thinking = st.sampled_from([{"type": "thinking", "thinking": "hm", "signature": "s1"},
                            {"type": "redacted_thinking", "data": "xyz"}])
cached = text_block.map(lambda b: {**b, "cache_control": {"type": "ephemeral"}})
content = st.one_of(plain, st.lists(st.one_of(text_block, cached, thinking), max_size=3))


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    """Text-only Anthropic conversations: system as a string or blocks, thinking blocks."""
    n = draw(st.integers(1, 5))
    roles = [("user", "assistant")[i % 2] for i in range(n)]
    messages = [{"role": r, "content": draw(content)} for r in roles]
    system = draw(st.one_of(st.none(), plain, st.lists(text_block, max_size=3)))
    req: dict[str, Any] = {"model": "m", "messages": messages}
    if system is not None:
        req["system"] = system
    return req


def chat_of(req: dict[str, Any]) -> ChatPrompt:
    return to_chat(CountTokensRequest.model_validate(req))


def _blocks_of(msg: dict[str, Any]) -> str | list[dict[str, Any]]:
    """A message's content, its past reasoning as a thinking block first."""
    if not msg.get("reasoning_content"):
        return msg["content"]
    return [{"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""},
            {"type": "text", "text": msg["content"]}]


def as_request(prompt: ChatPrompt) -> dict[str, Any]:
    """A normalised (text-only) prompt, sent again as an Anthropic request."""
    msgs = list(prompt.messages)
    req: dict[str, Any] = {"model": "m", "messages": []}
    if msgs and msgs[0]["role"] == "system":
        req["system"] = msgs.pop(0)["content"]
    req["messages"] = [{"role": m["role"], "content": _blocks_of(m)} for m in msgs]
    if prompt.prefill is not None:
        req["messages"].append({"role": "assistant", "content": prompt.prefill})
    return req


# --- normalisation --------------------------------------------------------------------------

@FAST
@given(conversations())
def test_normalisation_is_idempotent(req: dict[str, Any]) -> None:
    once = chat_of(req)
    assert chat_of(as_request(once)) == once


@FAST
@given(st.lists(st.sampled_from(["x-anthropic-a: 1", "X-Anthropic-Cch: 2", "", "  ", "hello",
                                 "x-anthropic-b:", "tail text"]), max_size=6).map("\n".join))
@example("x-anthropic-a: b\n\nx-anthropic-c: d\nhello")
def test_strip_volatile_is_idempotent(text: str) -> None:
    assert strip_volatile(strip_volatile(text)) == strip_volatile(text)


@FAST
@given(st.lists(text_block, max_size=4), st.integers(0, 4), nonce, nonce, conversations())
def test_billing_block_never_survives(blocks: list[dict[str, Any]], at: int, n1: str, n2: str,
                                      conv: dict[str, Any]) -> None:
    """The per-request billing block is dropped wherever it is, whatever its nonce."""
    def with_nonce(n: str) -> ChatPrompt:
        system = list(blocks)
        system.insert(min(at, len(system)), {"type": "text", "text": billing(n)})
        return chat_of({**conv, "system": system})

    first, second = with_nonce(n1), with_nonce(n2)
    assert first == second
    assert "x-anthropic-billing-header" not in first.messages[0]["content"]


@FAST
@given(nonce, nonce, plain)
def test_billing_line_never_survives_a_string_system(n1: str, n2: str, rest: str) -> None:
    one, two = system_text(f"{billing(n1)}\n{rest}"), system_text(f"{billing(n2)}\n{rest}")
    assert one == two and "x-anthropic" not in (one or "")


@FAST
@given(st.lists(plain, min_size=1, max_size=4), st.sampled_from(["user", "assistant"]))
def test_string_and_block_content_are_equivalent(texts: list[str], role: str) -> None:
    blocks = [{"type": "text", "text": t} for t in texts]
    last = [{"role": "user", "content": "q"}] if role == "assistant" else []
    as_blocks = chat_of({"model": "m", "messages": [{"role": role, "content": blocks}, *last]})
    as_text = chat_of({"model": "m",
                       "messages": [{"role": role, "content": "\n".join(texts)}, *last]})
    assert as_blocks == as_text


@FAST
@given(st.lists(nonblank, min_size=1, max_size=4))
def test_string_and_block_system_are_equivalent(texts: list[str]) -> None:
    blocks = [TextBlock(type="text", text=t) for t in texts]
    assert system_text("\n\n".join(texts)) == system_text(blocks)


# --- templating -----------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=10))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
roles = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
                  st.text(max_size=8), st.integers())
calls = st.lists(st.one_of(
    st.fixed_dictionaries({"function": st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=8), scalars), "arguments": json_values})}),
    st.fixed_dictionaries({"name": st.text(max_size=8), "arguments": json_values}),
    json_values), max_size=2)
any_message = st.one_of(
    st.fixed_dictionaries({"role": roles, "content": st.one_of(st.text(max_size=20),
                                                               json_values)},
                          optional={"tool_calls": st.one_of(calls, json_values),
                                    "name": scalars, "tool_call_id": scalars}),
    json_values)


@FAST
@given(st.lists(any_message, max_size=5), st.one_of(st.none(), st.lists(json_values, max_size=2)),
       st.booleans())
def test_render_raises_only_template_render_error(
    tok: ChatTokenizer, messages: list[Any], tools: Any, gen: bool
) -> None:
    try:
        text = tok.render(messages, tools=tools, add_generation_prompt=gen)
    except TemplateRenderError:
        return
    assert isinstance(text, str)
    tok.encode(text)  # whatever renders also tokenizes


text_messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                           "content": st.text(max_size=30)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": st.text(max_size=30)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.text(max_size=10),
                           "tool_calls": st.lists(st.fixed_dictionaries({"function": (
                               st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8),
                                                      "arguments": st.dictionaries(
                                                          st.text(max_size=4), scalars,
                                                          max_size=2)}))}),
                               min_size=1, max_size=2)}),
), min_size=1, max_size=6)


@FAST
@given(st.one_of(st.none(), st.text(max_size=30)), text_messages, st.data())
def test_rendering_a_prefix_is_a_prefix(
    tok: ChatTokenizer, system: str | None, messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Turn N's prompt starts turn N+1's: the prefix cache depends on it.

    Cuts fall between turns: a run of tool messages shares one user turn in ChatML,
    so a cut inside the run closes that turn early (by design of the template).
    """
    full = ([{"role": "system", "content": system}] if system is not None else []) + messages
    cuts = [k for k in range(1, len(full) + 1)
            if k == len(full) or not (full[k - 1]["role"] == full[k]["role"] == "tool")]
    k = data.draw(st.sampled_from(cuts))
    whole = tok.render(full, add_generation_prompt=False)
    head = tok.render(full[:k], add_generation_prompt=False)
    assert whole.startswith(head)
    assert tok.render(full, add_generation_prompt=True) == whole + "<|im_start|>assistant\n"
    head_ids = tok.encode(head)  # and token by token: turns end with special tokens
    assert tok.encode(whole)[: len(head_ids)] == head_ids


# --- hashing --------------------------------------------------------------------------------

token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=300)
block_sizes = st.sampled_from([1, 2, 3, 4, 16, 64])
salts = st.integers(0, HASH_MASK)


@FAST
@given(token_ids, token_ids, block_sizes, salts)
def test_hashes_of_a_prefix_are_a_prefix(a: list[int], b: list[int], bs: int, salt: int) -> None:
    head = block_hashes(a, bs, salt)
    assert block_hashes(a + b, bs, salt)[: len(head)] == head


@FAST
@given(token_ids, token_ids, block_sizes, salts)
def test_parent_continues_the_chain(a: list[int], b: list[int], bs: int, salt: int) -> None:
    a = a[: len(a) - len(a) % bs]  # a whole number of blocks
    head = block_hashes(a, bs, salt)
    tail = block_hashes(b, bs, salt, parent=head[-1]) if head else block_hashes(b, bs, salt)
    assert block_hashes(a + b, bs, salt) == head + tail


@FAST
@given(token_ids, block_sizes, salts, salts)
def test_different_salts_differ(ids: list[int], bs: int, s1: int, s2: int) -> None:
    if s1 == s2:
        s2 = (s1 + 1) & HASH_MASK
    one, two = block_hashes(ids, bs, s1), block_hashes(ids, bs, s2)
    assert len(one) == len(two) == len(ids) // bs
    assert all(x != y for x, y in zip(one, two, strict=True))


@FAST
@given(token_ids, block_sizes, st.text(max_size=20))
def test_hashing_is_deterministic(ids: list[int], bs: int, identity: str) -> None:
    salt = model_salt(identity)
    assert salt == model_salt(identity)
    out = block_hashes(ids, bs, salt)
    assert out == block_hashes(list(ids), bs, salt) == block_hashes(tuple(ids), bs, salt)
    assert out == block_hashes(np.asarray(ids, dtype=np.int64), bs, salt)
    assert out == block_hashes(np.asarray(ids, dtype="<u4"), bs, salt)
    assert all(0 <= h <= HASH_MASK for h in out)


@FAST
@given(token_ids, st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)),
       st.integers(0, 300))
def test_out_of_range_ids_are_refused(ids: list[int], bad: int, at: int) -> None:
    ids = ids + [0] * 64
    ids.insert(min(at, len(ids) - 64), bad)  # inside the hashed blocks
    with pytest.raises(ValueError):
        block_hashes(ids, 64)
