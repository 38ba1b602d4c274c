"""Logprobs end to end on real parts: Ray Serve on loopback, one mlx-lm CPU replica of the
tiny model, the openai SDK and lm-eval's ``local-completions`` (its defaults) as clients.
The values kvroute returns are checked against mlx-lm's own: one forward pass of the same
model over the same token ids, here in the test."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deploy.config import ModelConfig
from tests.e2e import lm_eval_run
from tests.stacks import deployed, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.stack("logprobs")]
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = ModelConfig(name=MODEL, engine="mlx", model_path=str(tiny_model_dir),
                        num_replicas=1, num_cpus=0.5)
    with deployed(stack_config(serve_port, model), timeout_s=300) as base:
        yield base


class Own:
    """mlx-lm's own logprobs for the tiny model (no kvroute in between)."""

    def __init__(self, model_dir: Path) -> None:
        from mlx_lm import load

        self.model, self.tok = load(str(model_dir))

    def rows(self, ids: list[int]) -> Any:
        import mlx.core as mx

        logits = self.model(mx.array(ids)[None])[0]
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def of(self, ids: list[int]) -> list[float]:
        """Each token's logprob given the ones before it (tokens 1..)."""
        lp = self.rows(ids)
        return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.fixture(scope="module")
def own(tiny_model_dir: Path) -> Own:
    return Own(tiny_model_dir)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _prompt(n: int, base: int = 0) -> list[int]:
    return [5 + (base * 131 + i * 17) % 4000 for i in range(n)]


def test_echo_logprobs_equal_mlx_lm_own(url: str, own: Own) -> None:
    """lm-eval's loglikelihood request: ids, echo, logprobs 1, max_tokens 1."""
    ids = _prompt(40, 1)
    body = httpx.post(f"{url}/v1/completions", json={
        "model": MODEL, "prompt": [ids], "echo": True, "logprobs": 1, "max_tokens": 1,
        "temperature": 0}, timeout=120).json()
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 41
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:-1] == pytest.approx(own.of(ids), abs=2e-3)
    assert lp["tokens"][:40] == [own.tok.decode([t]) for t in ids]
    assert body["choices"][0]["text"].startswith(own.tok.decode(ids))
    last = own.rows(ids)[-1]
    best = int(last.argmax().item())  # greedy: the generated token is mlx-lm's argmax
    assert lp["tokens"][-1] == own.tok.decode([best])
    assert lp["token_logprobs"][-1] == pytest.approx(last[best].item(), abs=2e-3)
    for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
        assert 1 <= len(top) <= 2 and value in top.values() and max(top.values()) <= 0


def test_chat_logprobs_whole_and_streamed(url: str) -> None:
    client = _client(url)
    msgs = [{"role": "user", "content": "Say something about rivers."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                           temperature=0, logprobs=True, top_logprobs=5)
    content = whole.choices[0].logprobs.content  # the SDK's own types parse the shape
    assert len(content) == whole.usage.completion_tokens
    for x in content:
        tops = [t.logprob for t in x.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True) and x.logprob <= 0
        assert x.top_logprobs[0].token == x.token and x.bytes == list(x.token.encode())
    streamed = []
    for chunk in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                                temperature=0, logprobs=True, top_logprobs=5,
                                                stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [x.token for x in streamed] == [x.token for x in content]
    assert [x.logprob for x in streamed] == pytest.approx([x.logprob for x in content],
                                                          abs=2e-3)


def test_responses_include_output_text_logprobs(url: str) -> None:
    client = _client(url)
    ask: dict[str, Any] = {"model": MODEL, "input": "Say something about rivers.",
                           "max_output_tokens": 6, "temperature": 0, "top_logprobs": 3,
                           "include": ["message.output_text.logprobs"], "store": False}
    whole = client.responses.create(**ask)
    part = next(i for i in whole.output if i.type == "message").content[0]
    assert part.logprobs and all(len(x.top_logprobs) == 3 for x in part.logprobs)
    assert [x.token for x in part.logprobs] == [x.top_logprobs[0].token for x in part.logprobs]
    deltas = [e for e in client.responses.create(**ask, stream=True)
              if e.type == "response.output_text.delta"]
    streamed = [x.token for e in deltas for x in e.logprobs]
    assert streamed == [x.token for x in part.logprobs]
    plain = client.responses.create(**{**ask, "include": None})  # top_logprobs alone: none
    assert not next(i for i in plain.output if i.type == "message").content[0].logprobs


def test_streamed_echo_sends_the_prompt_first(url: str, own: Own) -> None:
    ids = _prompt(12, 2)
    texts, tokens = [], []
    for chunk in _client(url).completions.create(model=MODEL, prompt=ids, echo=True,
                                                 logprobs=0, max_tokens=3, stream=True,
                                                 temperature=0):
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            if chunk.choices[0].logprobs:
                tokens.extend(chunk.choices[0].logprobs.tokens or [])
    assert texts[0].startswith(own.tok.decode(ids))
    assert len(tokens) == 12 + 3 and tokens[:12] == [own.tok.decode([t]) for t in ids]


def test_prompt_logprobs_are_no_cache_hit(url: str) -> None:
    ids = _prompt(300, 3)
    ask = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json=ask, timeout=120)
    again = httpx.post(f"{url}/v1/completions", json=ask, timeout=120)
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    scored = httpx.post(f"{url}/v1/completions", json={**ask, "prompt_logprobs": 2},
                        timeout=120)
    assert scored.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert scored.headers["x-kvroute-predicted-cached-tokens"] == "0"
    plp = scored.json()["choices"][0]["prompt_logprobs"]  # vLLM's shape
    assert plp[0] is None and len(plp) == 300
    assert all(str(t) in row for t, row in zip(ids[1:], plp[1:], strict=True))


@pytest.mark.parametrize(("path", "body", "param"), [
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
])
def test_bad_logprobs_are_400_naming_the_field(url: str, path: str, body: dict[str, Any],
                                               param: str) -> None:
    base = {"model": MODEL, "max_tokens": 2}
    base |= {"messages": [{"role": "user", "content": "hi"}]} if path.startswith("chat") \
        else {"prompt": "hi"}
    r = httpx.post(f"{url}/v1/{path}", json=base | body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_lm_eval_local_completions(url: str, own: Own, tiny_model_dir: Path,
                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """lm-eval 0.4's ``local-completions`` with its defaults (tokenized requests, batch
    size 1: ``prompt: [[ids]]``), a loglikelihood task and a generation task on local files;
    its loglikelihoods are mlx-lm's own for the same tokens."""
    lm, out = lm_eval_run.evaluate(url, MODEL, tiny_model_dir, monkeypatch, tmp_path)
    samples = out["samples"]["kvroute_mc"]
    assert len(samples) == 3
    for s in samples:
        doc = s["doc"]
        for choice, resp in zip(doc["choices"], s["resps"], strict=True):
            ctx, cont = lm._encode_pair(doc["question"], " " + choice)
            want = sum(own.of(ctx + cont)[len(ctx) - 1:])
            got = float(resp[0][0])
            assert math.isfinite(got) and got == pytest.approx(want, abs=5e-3)
