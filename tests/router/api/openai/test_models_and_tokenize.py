"""The surface agent clients and SDKs probe besides the chat routes, on the real ingress
app: ``HEAD /health`` and ``/v1/models``, ``GET /v1/models/{id}`` (the OpenAI SDK's
``models.retrieve``), aliases listed as models, vLLM's ``/tokenize``, ``/detokenize`` and
``/version``, and the ids and ``system_fingerprint`` of the OpenAI objects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from deploy.config import KvrouteConfig, ModelConfig
from router.api.common import request as rq
from router.auth.keys import Authenticator
from router.routing.target import Targets
from tests.router.auth.test_auth_routes import LimitedCore, ingress_client

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[tuple[LimitedCore, TestClient]]:
    """Two models of one tokenizer, a group over them and two aliases; no keys."""
    core = LimitedCore(tiny_model_dir)
    core.auth = Authenticator([])
    models = [ModelConfig(name="tiny", model_path=str(tiny_model_dir), context_window=4096),
              ModelConfig(name="tiny-b", model_path=str(tiny_model_dir), context_window=2048)]
    core.config = KvrouteConfig(models=models, groups=[{"name": "pair", "models": [
        {"model": "tiny"}, {"model": "tiny-b"}]}], aliases={"claude-*": "tiny", "gpt-x": "pair"})
    core.targets = Targets(core.config, {"tiny": core.tok, "tiny-b": core.tok})
    for c in ingress_client(core):
        yield core, c


def _sdk(c: TestClient) -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                         http_client=c)


def test_head_on_health_and_models(served: tuple[LimitedCore, TestClient]) -> None:
    _, c = served
    assert c.head("/health").status_code == 200
    assert c.head("/v1/models").status_code == 200


def test_models_list_groups_and_aliases_marked(served: tuple[LimitedCore, TestClient]) -> None:
    _, c = served
    data = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert list(data) == ["tiny", "tiny-b", "pair", "claude-*", "gpt-x"]
    assert [data[n]["kind"] for n in data] == ["model", "model", "group", "alias", "alias"]
    assert data["pair"]["max_model_len"] == 2048  # its smallest member's
    assert (data["claude-*"]["alias_of"], data["claude-*"]["parent"]) == ("tiny", "tiny")
    assert data["gpt-x"]["max_model_len"] == 2048 and "alias_of" not in data["tiny"]


def test_the_sdk_retrieves_models_groups_and_aliased_names(
        served: tuple[LimitedCore, TestClient]) -> None:
    _, c = served
    sdk = _sdk(c)
    assert sdk.models.retrieve("tiny").id == "tiny"
    assert sdk.models.retrieve("pair").model_extra["kind"] == "group"  # type: ignore[index]
    card = sdk.models.retrieve("claude-sonnet-4-5")  # matched by claude-*
    assert card.id == "claude-sonnet-4-5" and card.model_extra["alias_of"] == "tiny"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as err:
        sdk.models.retrieve("nope")
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert [m.id for m in sdk.models.list()][:2] == ["tiny", "tiny-b"]


def test_tokenize_a_prompt_and_messages_as_the_routes_send_them(
        served: tuple[LimitedCore, TestClient]) -> None:
    core, c = served
    r = c.post("/tokenize", json={"model": "tiny", "prompt": "hello world",
                                  "return_token_strs": True}).json()
    assert r["tokens"] == core.tok.encode("hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 4096 and "".join(r["token_strs"]) == "hello world"
    chat = {"model": "tiny", "messages": USER, "max_tokens": 4}
    assert c.post("/v1/chat/completions", json=chat).status_code == 200
    r = c.post("/tokenize", json={"model": "tiny", "messages": USER}).json()
    assert r["tokens"] == core.calls[-1]["ids"] and r["token_strs"] is None


def test_detokenize_round_trips_and_checks_ids(served: tuple[LimitedCore, TestClient]) -> None:
    core, c = served
    ids = core.tok.encode("round trip")
    assert c.post("/detokenize", json={"model": "tiny", "tokens": ids}).json() == {
        "prompt": "round trip"}
    r = c.post("/detokenize", json={"model": "tiny", "tokens": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_token_ids"


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"model": "tiny"}, 400, "invalid_request"),  # neither prompt nor messages
    ({"model": "tiny", "prompt": "x", "messages": USER}, 400, "invalid_request"),
    ({"prompt": "x"}, 400, "invalid_request"),  # two models served: model is required
    ({"model": "nope", "prompt": "x"}, 404, "model_not_found"),
    ({"model": "tiny", "messages": USER, "add_generation_prompt": False}, 400,
     "invalid_request"),
])
def test_tokenize_refusals(served: tuple[LimitedCore, TestClient], body: dict[str, Any],
                           status: int, code: str) -> None:
    _, c = served
    r = c.post("/tokenize", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


def test_version(served: tuple[LimitedCore, TestClient]) -> None:
    _, c = served
    assert c.get("/version").json()["version"] == "0.1.0"


def test_tokenize_needs_a_key_when_keys_are_on(tiny_model_dir: Path) -> None:
    core = LimitedCore(tiny_model_dir)
    for c in ingress_client(core):
        assert c.post("/tokenize", json={"prompt": "x"}).status_code == 401
        assert c.get("/v1/models/tiny").status_code == 401
        assert c.head("/v1/models").status_code == 401
        assert c.head("/health").status_code == 200 and c.get("/version").status_code == 200




@pytest.mark.parametrize("stream", [False, True])
def test_openai_ids_and_system_fingerprint(served: tuple[LimitedCore, TestClient],
                                           stream: bool, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Serve's request id (x-request-id) carries no prefix; the objects' ids do."""
    _, c = served
    monkeypatch.setattr(rq, "request_id", lambda prefix: "0f2e9a7c-serve-id")
    objs: list[dict[str, Any]] = []
    for path, body, prefix in [
            ("/v1/chat/completions", {"messages": USER}, "chatcmpl-"),
            ("/v1/completions", {"prompt": "hi"}, "cmpl-")]:
        opts = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        r = c.post(path, json={"model": "tiny", "max_tokens": 4, **body, **opts})
        got = [json.loads(line[6:]) for line in r.text.splitlines()
               if line.startswith("data: {")] if stream else [r.json()]
        assert got and all(o["id"] == f"{prefix}0f2e9a7c-serve-id" for o in got), got
        objs += got
    fps = {o["system_fingerprint"] for o in objs}
    assert len(fps) == 1 and next(iter(fps)).startswith("fp_")


def test_responses_and_messages_ids(served: tuple[LimitedCore, TestClient]) -> None:
    _, c = served
    resp = c.post("/v1/responses", json={"model": "tiny", "input": "hi"}).json()
    assert resp["id"].startswith("resp_")
    assert all(i["id"].startswith(("msg_", "rs_")) for i in resp["output"])
    msg = c.post("/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": USER})
    assert msg.json()["id"].startswith("msg_")
