"""The field rule and the sampling controls on a real stack: Ray Serve on loopback, one
sim replica (the engine emulator, EOS every 4th step) behind the router, requests started
over the replica's loopback call (the default ``router.start_transport``), so every
control crosses that wire. Real SDK clients where the API has one.

Refused fields are a 400 naming them in each API's shape; an unknown field is served and
counted in ``kvroute_ignored_fields_total``; ``min_tokens``, ``stop_token_ids`` and
``ignore_eos`` reach the engine and change what it writes; completions default to 16
tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from deploy.config import ModelConfig
from tests.stacks import counter, deployed, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-fields"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    sim = ModelConfig(name=MODEL, engine="sim", model_path=str(tiny_model_dir), num_replicas=1,
                      num_cpus=0.1, engine_kwargs={"tpot_s": 0.001, "prefill_tok_s": 100000.0,
                                                   "eos_every": 4})
    with deployed(stack_config(serve_port, sim)) as url:
        yield url


def _oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url=f"{url}/v1", max_retries=0)


def test_min_tokens_and_ignore_eos_change_the_length(stack: str) -> None:
    oa = _oa(stack)
    msgs = [{"role": "user", "content": "count"}]
    plain = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30)
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens == 3
    held = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30,
                                      extra_body={"min_tokens": 10})
    assert held.usage.completion_tokens == 10 and held.choices[0].finish_reason == "stop"
    free = oa.completions.create(model=MODEL, prompt="count", extra_body={"ignore_eos": True})
    assert free.usage.completion_tokens == 16  # no max_tokens: OpenAI's and vLLM's 16
    assert free.choices[0].finish_reason == "length"


def test_stop_token_ids_end_the_output(stack: str) -> None:
    body = {"model": MODEL, "prompt": [10, 11, 12, 13], "max_tokens": 8, "ignore_eos": True}
    full = httpx.post(f"{stack}/v1/completions", json=body, timeout=60).json()
    ids = httpx.post(f"{stack}/tokenize", timeout=60, json={
        "model": MODEL, "prompt": full["choices"][0]["text"]}).json()["tokens"]
    stop = ids[2]
    cut = httpx.post(f"{stack}/v1/completions", timeout=60,
                     json={**body, "stop_token_ids": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == ids.index(stop)


def test_refused_fields_name_themselves_in_each_apis_shape(stack: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _oa(stack).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            extra_body={"use_beam_search": True})
    assert err.value.param == "use_beam_search"
    ac = anthropic.Anthropic(api_key="x", base_url=stack, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as aerr:
        ac.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                           extra_body={"container": "c-1"})  # kvroute runs no hosted tools
    assert aerr.value.body["error"]["message"].startswith("container: ")
    r = httpx.post(f"{stack}/v1/responses", timeout=60, json={
        "model": MODEL, "input": "x", "background": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"


def test_an_unknown_field_is_served_and_counted(stack: str) -> None:
    name = "kvroute_ignored_fields_total"
    before = counter(stack, name)
    r = httpx.post(f"{stack}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
        "x_future_field": {"a": 1}})
    assert r.status_code == 200, r.text
    assert counter(stack, name) == before + 1
    text = httpx.get(f"{stack}/metrics", timeout=10).text
    assert 'api="chat"' in text and 'field="x_future_field"' in text
