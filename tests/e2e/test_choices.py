"""OpenAI's ``n`` and batched completion prompts on a real stack: Ray Serve, two sim-engine
replicas, the openai SDK as the client. Each prompt is routed once and its copies run on
the replica that prefilled it (its prefix cache serves them: one prefill per prompt), each
copy sampled on its own (seeded: ``seed + i``), choices indexed ``prompt_index * n + i``,
usage once per prompt, whole and streamed; ``continuous_usage_stats`` on every chunk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deploy.config import IndexConfig
from tests.stacks import counter, deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-choices"
BLOCK = IndexConfig().block_size


@pytest.fixture(scope="module")
def client(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[Any]:
    model = sim_model(MODEL, tiny_model_dir, replicas=2, tpot_s=0.001)
    with deployed(stack_config(serve_port, model, index=IndexConfig(redis_url=None))) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        c.url = url  # type: ignore[attr-defined]
        yield c


def _messages(tag: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{tag}: " + "tell me about prefix caches. " * 40}]


def _chat(client: Any, tag: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=_messages(tag), max_tokens=6,
                                          **kw)


def test_n_copies_share_one_prefill_and_differ_by_seed(client: Any) -> None:
    cached = counter(client.url, "kvroute_cached_tokens_total")
    many = _chat(client, "copies-cold", n=3, seed=11)  # a new prompt: nothing cached yet
    assert [c.index for c in many.choices] == [0, 1, 2]
    texts = [c.message.content for c in many.choices]
    assert len(set(texts)) == 3  # each copy its own sampler: seeds 11, 12, 13
    assert many.usage.completion_tokens == 3 * 6
    # copies 1 and 2 found copy 0's prefilled prompt on its replica, all but the tail
    got = counter(client.url, "kvroute_cached_tokens_total") - cached
    assert got >= 2 * (many.usage.prompt_tokens // BLOCK * BLOCK - BLOCK)
    again = _chat(client, "copies-cold", n=3, seed=11)
    assert [c.message.content for c in again.choices] == texts  # seeded copies repeat
    single = _chat(client, "copies-cold", seed=12)
    assert single.choices[0].message.content == texts[1]  # copy 1 is seed + 1
    assert many.usage.prompt_tokens == single.usage.prompt_tokens  # counted once


def test_n_streams_every_choice_with_its_index_and_usage_once(client: Any) -> None:
    whole = _chat(client, "streamed", n=2, seed=5)
    stream = _chat(client, "streamed", n=2, seed=5, stream=True,
                   stream_options={"include_usage": True})
    text: dict[int, str] = {0: "", 1: ""}
    ends: dict[int, str | None] = {}
    usages = []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                ends[c.index] = c.finish_reason
        assert chunk.id.startswith("chatcmpl-") and chunk.system_fingerprint
    assert text == {c.index: c.message.content for c in whole.choices}
    assert ends == {0: "length", 1: "length"}
    assert len(usages) == 1 and usages[0].completion_tokens == 12
    assert usages[0].prompt_tokens == whole.usage.prompt_tokens


def test_n_null_is_one_choice(client: Any) -> None:
    out = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_messages("null"), max_tokens=2, n=None)
    assert len(out.parse().choices) == 1


def _ids(client: Any, text: str) -> list[int]:
    r = httpx.post(f"{client.url}/tokenize", json={"model": MODEL, "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.mark.parametrize("as_ids", [True, False])
def test_a_batched_prompt_is_a_choice_per_prompt_and_copy(client: Any, as_ids: bool) -> None:
    texts = [f"batch {i}: " + "an old story of caches. " * 30 for i in range(2)]
    prompts: list[Any] = [_ids(client, t) for t in texts] if as_ids else texts
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4, seed=3)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt_index * n + i
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=4, seed=3)
               for p in prompts]
    assert [out.choices[0].text, out.choices[2].text] == [s.choices[0].text for s in singles]
    assert out.choices[0].text != out.choices[1].text
    assert out.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert out.usage.completion_tokens == 4 * 4
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4,
                                           seed=3, stream=True):
        assert chunk.id.startswith("cmpl-")
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in out.choices}


def test_continuous_usage_stats_count_every_chunk(client: Any) -> None:
    stream = client.completions.create(
        model=MODEL, prompt="count me", max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    text = ""
    for c in chunks:
        if c.choices:
            text += c.choices[0].text
            # the sim's tokens are whole words: the words so far are the tokens so far
            assert c.usage.completion_tokens == len(text.split())
            assert c.usage.total_tokens == c.usage.prompt_tokens + len(text.split())
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
