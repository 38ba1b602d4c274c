"""Incremental tokenization is bit-identical to whole-text tokenization (router.prompt.cache).

Every check compares ``ChatTokenizer.encode`` (cached prefix + the new part) with
``encode_full`` (the whole text, no cache) and the block hashes computed through the memo
with those of a plain list. Counterexamples show why the boundary rules are needed.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_service.hashing import block_hashes, token_bytes
from ops.bench.harness.workloads import AgentParams, AgentWorkload, flatten
from router.prompt.cache import IncrementalEncoder, PromptCacheConfig, TokenIds, boundary_tokens
from router.prompt.tokenizer import ChatTokenizer
from tests.router.tokenizer_families import llama3_like_dir, metaspace_first, with_added

SALT = 0x5EED
COUNT = {"checks": 0}

WORDS = ["the", "model", "def", "return", " ", "  ", "\n", "\n\n", "\t", "x=1;", "ünïcödé",
         "日本語", "\u0301", "e\u0301", "\U0001F600", "1234", "'s", "'ll", "<|im_end|>",
         "<|im_start|>", "<|im_", "|>", "<|", "<tool_call>", "</tool_call>", "<|endoftext|>",
         "<|eot_id|>", "\r\n", "{\"a\": [1, 2]}", "-->", "Ω≈ç√"]
texts = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=12).map(
    "".join)
roles = st.sampled_from(["user", "assistant", "tool", "system"])
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": texts}), min_size=1,
                    max_size=8)


def check(tok: ChatTokenizer, text: str) -> list[int]:
    """The cached encode equals whole-text tokenization; so do its wire bytes (``u32``,
    joined from the cached segments') and the block hashes."""
    ids = tok.encode(text)
    full = tok.encode_full(text)
    assert ids == full, text
    assert isinstance(ids, TokenIds) and ids.u32 == token_bytes(list(full)), text
    assert block_hashes(ids, 64, SALT) == block_hashes(list(full), 64, SALT)
    assert block_hashes(ids, 16, SALT) == block_hashes(list(full), 16, SALT)
    COUNT["checks"] += 1
    return ids


def check_growing(tok: ChatTokenizer, msgs: list[dict[str, Any]],
                  system: str | None = None) -> None:
    """Each prefix of the conversation, as turns of a growing session."""
    head = [{"role": "system", "content": system}] if system is not None else []
    for n in range(1, len(msgs) + 1):
        check(tok, tok.render(head + msgs[:n]))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> ChatTokenizer:
    # A small cache, so eviction happens throughout the property tests.
    return ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(max_bytes=256 << 10))


def test_tiny_model_boundaries_are_the_chatml_markers(tiny: ChatTokenizer) -> None:
    assert tiny.prompt_cache.boundaries == ("<|im_end|>", "<|im_start|>")


def test_random_conversations_bit_identical(tiny: ChatTokenizer) -> None:
    @settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(msgs=messages, system=st.one_of(st.none(), texts))
    def run(msgs: list[dict[str, Any]], system: str | None) -> None:
        check_growing(tiny, msgs, system)
        assert tiny.prompt_cache.bytes <= tiny.prompt_cache.max_bytes

    before = COUNT["checks"]
    run()
    assert COUNT["checks"] - before >= 1500  # hypothesis really ran the examples


def test_raw_text_cut_anywhere_bit_identical(tiny: ChatTokenizer) -> None:
    """Completions prompts are raw text: special-token-like strings anywhere."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(a=texts, b=texts, c=texts)
    def run(a: str, b: str, c: str) -> None:
        for text in (a, a + "<|im_end|>" + b, a + "<|im_end|>" + b + "<|im_start|>" + c,
                     a + "<|im_end|><|im_end|>" + c, "<|im_start|>" + b):
            check(tiny, text)

    before = COUNT["checks"]
    run()
    assert COUNT["checks"] - before >= 5 * 300


def test_agent_sessions_bit_identical(tiny_model_dir: Path) -> None:
    """The bench's agent workload: growing histories, tool results, sub-agents, compaction,
    with tool definitions; every call is compared and the later calls hit the cache."""
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(max_bytes=64 << 20))
    work = AgentWorkload(AgentParams(seed=3, system_tokens=600, repo_tokens=300,
                                     tool_result_tokens=300, compact_tokens=8000,
                                     chars_per_token=4.0))
    calls = [c for i in range(3) for c in flatten(work.session(i))]
    for call in calls:
        body = call.request.body
        check(tok, tok.render(body["messages"], tools=body.get("tools")))
    stats = tok.prompt_cache.stats()
    assert len(calls) > 40
    assert stats["hit_tokens"] > 5 * stats["new_tokens"]


def test_changed_system_block_falls_back_at_the_first_difference(tiny: ChatTokenizer) -> None:
    turn = [{"role": "user", "content": "a long question " * 50},
            {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "more"}]
    check_growing(tiny, turn, "system one")
    before = tiny.prompt_cache.stats()["hit_tokens"]
    ids = check(tiny, tiny.render([{"role": "system", "content": "system two"}, *turn]))
    hit = tiny.prompt_cache.stats()["hit_tokens"] - before
    assert hit == 1  # only the leading "<|im_start|>" is shared
    assert len(ids) > 100


def test_repeated_prompt_tokenizes_only_the_tail(tiny: ChatTokenizer) -> None:
    text = tiny.render([{"role": "user", "content": "word " * 2000}])
    check(tiny, text)
    before = tiny.prompt_cache.stats()
    check(tiny, text)
    after = tiny.prompt_cache.stats()
    assert after["new_tokens"] - before["new_tokens"] <= 3  # "assistant\n"
    assert after["hit_tokens"] - before["hit_tokens"] > 2000


def test_eviction_keeps_the_bound(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(max_bytes=20_000))
    for i in range(50):
        check(tok, tok.render([{"role": "user", "content": f"turn {i} " * 300}]))
        assert tok.prompt_cache.bytes <= 20_000
    assert tok.prompt_cache.stats()["segments"] > 0


def test_disabled_cache_is_whole_text(tiny_model_dir: Path) -> None:
    tok = ChatTokenizer(str(tiny_model_dir), PromptCacheConfig(enabled=False))
    assert not tok.prompt_cache.active
    text = tok.render([{"role": "user", "content": "hi"}])
    assert tok.encode(text) == tok.encode_full(text)


def test_token_ids_pickle_as_plain_lists(tiny: ChatTokenizer) -> None:
    ids = tiny.encode(tiny.render([{"role": "user", "content": "x " * 100}]))
    assert isinstance(ids, TokenIds) and ids.hash_memo is not None
    back = pickle.loads(pickle.dumps(ids))
    assert type(back) is list and back == ids


# -- other tokenizer shapes -------------------------------------------------------------
def test_llama3_like_tokenizer_bit_identical(tmp_path: Path) -> None:
    tok = ChatTokenizer(str(llama3_like_dir(tmp_path)), PromptCacheConfig())
    assert set(tok.prompt_cache.boundaries) == {
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}

    @settings(max_examples=400, deadline=None)
    @given(msgs=messages, system=st.one_of(st.none(), texts))
    def run(msgs: list[dict[str, Any]], system: str | None) -> None:
        check_growing(tok, msgs, system)

    before = COUNT["checks"]
    run()
    assert COUNT["checks"] - before >= 400


def test_metaspace_first_is_not_cut_and_why(tmp_path: Path) -> None:
    """Metaspace with prepend_scheme "first" marks only the piece at offset 0, so a cut
    after a special token is NOT exact there: the tokenizer gets no boundaries."""
    tok = metaspace_first(tmp_path)
    whole = tok.encode("[INST]hello", add_special_tokens=False).ids
    parts = (tok.encode("[INST]", add_special_tokens=False).ids
             + tok.encode("hello", add_special_tokens=False).ids)
    assert whole != parts
    assert boundary_tokens(tok, ["[INST]hello[/INST]"]) == ()


def test_a_longer_added_token_vetoes_the_cut(tiny_model_dir: Path) -> None:
    """An added token that starts with the marker (``<|im_end|>\\n``) could span the cut."""
    tok = with_added(tiny_model_dir, "<|im_end|>\n")
    whole = tok.encode("a<|im_end|>\nb", add_special_tokens=False).ids
    parts = (tok.encode("a<|im_end|>", add_special_tokens=False).ids
             + tok.encode("\nb", add_special_tokens=False).ids)
    assert whole != parts
    assert "<|im_end|>" not in boundary_tokens(tok, ["<|im_start|>u\na<|im_end|>\n"])


@pytest.mark.parametrize("bad", ["\n", " ", "e"])
def test_a_wrong_boundary_is_caught(tiny: ChatTokenizer, bad: str) -> None:
    """The comparison has teeth: cutting after ordinary text breaks the identity."""
    enc = IncrementalEncoder(tiny._tok, [bad], 1 << 20)
    samples = ["hello world\n\nfoo", "the model  returns\n  x", "there\n\n\nthe end"]
    for s in samples:
        enc.encode(s)
    assert any(enc.encode(s) != tiny.encode_full(s) for s in samples)
