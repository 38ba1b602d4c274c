"""The output budget, the same on every API: a limit over the room the prompt leaves is cut
to it (``x-kvroute-max-tokens-cut`` says so), a prompt that alone fills the window is a 400
``context_length_exceeded`` in the API's own shape, and a prompt whose text alone cannot
fit is refused before the template and the tokenizer run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from router.api.common.request import MAX_TOKENS_CUT
from tests.router.api.anthropic.test_anthropic_api import FakeCore, make_client

USER = [{"role": "user", "content": "hi"}]
# Each API's request with a 32000-token output limit (what Qwen Code and Claude Code send).
ASKS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": USER, "max_tokens": 32000},
    "/v1/chat/completions#mct": {"messages": USER, "max_completion_tokens": 32000},
    "/v1/completions": {"prompt": "hi", "max_tokens": 32000},
    "/v1/completions#ids": {"prompt": [5, 6, 7], "max_tokens": 32000},
    "/v1/responses": {"input": "hi", "max_output_tokens": 32000},
    "/v1/messages": {"messages": USER, "max_tokens": 32000},
}


def _post(core: FakeCore, path: str, body: dict[str, Any]) -> Any:
    return make_client(core).post(path.split("#")[0], json={"model": "tiny", **body})


@pytest.mark.parametrize("path", sorted(ASKS))
def test_a_limit_over_the_window_is_cut_to_fit_and_said(tiny_model_dir: Path,
                                                        path: str) -> None:
    core = FakeCore(tiny_model_dir, context_window=4096)
    r = _post(core, path, ASKS[path])
    assert r.status_code == 200, r.text
    room = 4096 - len(core.calls[-1]["ids"])
    assert core.calls[-1]["sampling"].max_tokens == room
    assert r.headers[MAX_TOKENS_CUT] == str(room)


@pytest.mark.parametrize("path", sorted(ASKS))
def test_a_limit_that_fits_is_kept_and_no_header(tiny_model_dir: Path, path: str) -> None:
    core = FakeCore(tiny_model_dir, context_window=4096)
    body = {k: (64 if "max" in k else v) for k, v in ASKS[path].items()}
    r = _post(core, path, body)
    assert r.status_code == 200, r.text
    assert core.calls[-1]["sampling"].max_tokens == 64 and MAX_TOKENS_CUT not in r.headers


def test_the_openai_sdk_asking_32000_on_a_4k_model_gets_a_reply(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=4096)
    client = openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                           http_client=make_client(core))
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=USER,
                                                           max_tokens=32000)
    assert raw.parse().choices[0].message.content == "Hello there."
    assert int(raw.headers[MAX_TOKENS_CUT]) == 4096 - len(core.calls[-1]["ids"])


LONG = "word " * 200  # ~200 tokens, 1000 characters: over a 64-token window
OVER: dict[str, tuple[dict[str, Any], str]] = {  # path -> (body, the param blamed)
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": LONG}]}, "messages"),
    "/v1/completions": ({"prompt": LONG}, "prompt"),
    "/v1/completions#ids": ({"prompt": [5] * 100}, "prompt"),
    "/v1/responses": ({"input": LONG}, "input"),
}


@pytest.mark.parametrize("path", sorted(OVER))
def test_a_prompt_over_the_window_is_openais_400(tiny_model_dir: Path, path: str) -> None:
    core = FakeCore(tiny_model_dir, context_window=64)
    body, param = OVER[path]
    r = _post(core, path, {**body, "max_tokens": 8})
    assert r.status_code == 400, r.text
    assert r.json()["error"] | {"message": ""} == {
        "message": "", "type": "invalid_request_error", "param": param,
        "code": "context_length_exceeded"}
    assert "maximum context length is 64 tokens" in r.json()["error"]["message"]
    assert core.calls == []


def test_a_prompt_over_the_window_is_anthropics_400(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=64)
    r = _post(core, "/v1/messages", {"messages": [{"role": "user", "content": LONG}],
                                     "max_tokens": 8})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith("prompt is too long: ")
    assert err["error"]["message"].endswith(" tokens > 63 maximum")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/v1/messages", "/v1/messages/count_tokens"])
def test_text_that_cannot_fit_is_refused_before_the_tokenizer(
        tiny_model_dir: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 tokens x 32 bytes a token at most: 2049 characters cannot fit, untokenized."""
    core = FakeCore(tiny_model_dir, context_window=64)

    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("the tokenizer ran")

    for name in ("encode_chat", "aencode", "render_encode"):
        monkeypatch.setattr(core.tok, name, never)
    text = "x" * (64 * 32 + 1)
    body = {"prompt": text} if path == "/v1/completions" else (
        {"input": text} if path == "/v1/responses" else
        {"messages": [{"role": "user", "content": text}]})
    r = _post(core, path, {**body, "max_tokens": 8})
    assert r.status_code == 400, r.text
    assert "at least 65 tokens" in r.text and core.calls == []
