"""Every sampling control through each API's flow to the worker's ``SamplingParams``
(``router.api.common.sampling``): honoured fields arrive, unset ones take the model's
defaults (its generation_config.json, else OpenAI's), out-of-range values and fields that
are not honoured yet are a 400 naming them, in the API's own shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.router.api.anthropic.test_anthropic_api import FakeCore, Script, make_client
from workers.protocol import SamplingParams

CHAT = ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
COMPLETIONS = ("/v1/completions", {"model": "tiny", "prompt": "x"})
RESPONSES = ("/v1/responses", {"model": "tiny", "input": "x"})
MESSAGES = ("/v1/messages", {"model": "tiny", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "x"}]})
ALL = {"top_k": 5, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
       "repetition_penalty": 1.3, "logit_bias": {"7": 250.0, "9": -3}, "min_tokens": 2,
       "ignore_eos": True, "stop_token_ids": [3, 3, 4], "bad_words": ["foo"], "seed": 5,
       "temperature": 0.4, "top_p": 0.9, "stop": ["END"], "max_tokens": 6}
WANT = SamplingParams(max_tokens=6, temperature=0.4, top_p=0.9, stop=("END",), seed=5,
                      ignore_eos=True, top_k=5, min_p=0.1, presence_penalty=0.5,
                      frequency_penalty=-0.5, repetition_penalty=1.3,
                      logit_bias=((7, 100.0), (9, -3.0)), min_tokens=2,
                      stop_token_ids=(3, 4), bad_words=("foo",))


def post(core: FakeCore, route: tuple[str, dict[str, Any]], **fields: Any) -> Any:
    path, body = route
    return make_client(core).post(path, json={**body, **fields})


def sent(core: FakeCore) -> SamplingParams:
    return core.calls[-1]["sampling"]


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS], ids=["chat", "completions"])
def test_every_control_reaches_the_worker(tiny_model_dir: Path, route: Any) -> None:
    core = FakeCore(tiny_model_dir)
    r = post(core, route, **ALL)
    assert r.status_code == 200, r.text
    assert sent(core) == WANT


def test_responses_take_vllms_extras(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    extras = {k: ALL[k] for k in ("top_k", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty", "logit_bias", "ignore_eos",
                                  "stop_token_ids", "seed", "temperature", "top_p", "stop")}
    r = post(core, RESPONSES, max_output_tokens=6, **extras)
    assert r.status_code == 200, r.text
    assert sent(core) == WANT.__class__(**{**_fields(WANT), "min_tokens": 0, "bad_words": ()})


def _fields(sp: SamplingParams) -> dict[str, Any]:
    return {f: getattr(sp, f) for f in sp.__slots__}  # type: ignore[attr-defined]


def test_messages_take_top_k_top_p_temperature_and_stop_sequences(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    r = post(core, MESSAGES, top_k=3, top_p=0.5, temperature=0.2, stop_sequences=["Z"])
    assert r.status_code == 200, r.text
    got = sent(core)
    assert (got.top_k, got.top_p, got.temperature, got.stop) == (3, 0.5, 0.2, ("Z",))


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS, RESPONSES, MESSAGES],
                         ids=["chat", "completions", "responses", "messages"])
def test_unset_fields_are_the_models_defaults(tiny_model_dir: Path, tmp_path: Path,
                                              route: Any) -> None:
    core = FakeCore(tiny_model_dir)
    assert post(core, route).status_code == 200
    plain = sent(core)
    assert (plain.temperature, plain.top_p, plain.top_k, plain.repetition_penalty) == \
        (1.0, 1.0, 0, 1.0)  # no sampling values in the tiny model's generation_config.json
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    gen = json.loads((model / "generation_config.json").read_text())
    gen |= {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}
    (model / "generation_config.json").write_text(json.dumps(gen))
    core = FakeCore(model)
    assert post(core, route).status_code == 200
    got = sent(core)
    assert (got.temperature, got.top_p, got.top_k) == (0.6, 0.9, 20)
    assert got.repetition_penalty == 1.1  # the model's default on every API, as vLLM's
    assert post(core, route, temperature=0).status_code == 200 and sent(core).temperature == 0


def test_completions_default_to_16_tokens_and_chat_to_the_models(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    post(core, COMPLETIONS)
    assert sent(core).max_tokens == 16
    post(core, CHAT)
    assert sent(core).max_tokens == core.models["tiny"].default_max_tokens


@pytest.mark.parametrize(("field", "value"), [
    ("top_k", -2), ("min_p", 1.5), ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("repetition_penalty", 0), ("min_tokens", -1), ("stop_token_ids", [-1]),
    ("bad_words", [""]), ("logit_bias", {"x": 1}), ("logit_bias", {"999999": 1}),
])
def test_an_out_of_range_control_is_a_400_naming_it(tiny_model_dir: Path, field: str,
                                                    value: Any) -> None:
    r = post(FakeCore(tiny_model_dir), CHAT, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field


def test_min_tokens_over_max_tokens_is_a_400(tiny_model_dir: Path) -> None:
    r = post(FakeCore(tiny_model_dir), COMPLETIONS, min_tokens=9, max_tokens=4)
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_min_tokens_yields_to_a_budget_cut_to_the_window(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=64)
    r = post(core, COMPLETIONS, min_tokens=100, max_tokens=500)
    assert r.status_code == 200, r.text
    assert sent(core).min_tokens == sent(core).max_tokens < 64


@pytest.mark.parametrize(("route", "field", "value"), [
    (CHAT, "use_beam_search", True), (CHAT, "echo", True),
    (CHAT, "include_stop_str_in_output", True), (COMPLETIONS, "suffix", "x"),
    (COMPLETIONS, "best_of", 3), (RESPONSES, "background", True),
    (RESPONSES, "structured_outputs", {"json": {"type": "object"}}),
])
def test_a_field_kvroute_cannot_honour_is_a_400_naming_it(tiny_model_dir: Path, route: Any,
                                                     field: str, value: Any) -> None:
    core = FakeCore(tiny_model_dir)
    r = post(core, route, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field and not core.calls


def test_anthropic_names_the_field_path(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    r = post(core, MESSAGES, output_format={"type": "json_schema", "schema": {}})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["message"].startswith("output_format: ")
    r = post(core, MESSAGES, mcp_servers=[{"type": "url", "url": "http://x", "name": "m"}])
    assert r.status_code == 400 and not core.calls
    assert r.json()["error"]["message"].startswith("mcp_servers: ")


def test_the_openai_sdk_sees_the_param(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["hi"]))
    client = openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                           http_client=make_client(core))
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"use_beam_search": True})
    assert err.value.param == "use_beam_search"
    out = client.chat.completions.create(  # what SDKs and tools send as no-ops is accepted
        model="tiny", messages=[{"role": "user", "content": "x"}], n=1, logprobs=False,
        presence_penalty=0, extra_body={"skip_special_tokens": True, "echo": False})
    assert out.choices[0].message.content == "hi"
