"""``tool_reference`` expansion is bounded before anything is rendered.

Each ``tool_reference`` block in a tool result copies the definition of the tool it names;
the copies count against the text a prompt may hold (``Target.max_prompt_chars``) as they
are made, so a small body that expands past it is a 413 naming the block, without the
template or the tokenizer running, on ``/v1/messages`` and ``count_tokens`` alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from tests.router.api.anthropic.test_anthropic_api import FakeCore, make_client

KEY = "k" * 40
DESC = ("lorem ipsum 1 dolor sit amet " * 4000)[:100_000]  # the longest description allowed


def _body(refs: int, desc: str = DESC) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 1,
            "tools": [{"name": "t", "description": desc, "input_schema": {"type": "object"},
                       "defer_loading": True}],
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "u",
                 "content": [{"type": "tool_reference", "tool_name": "t"}] * refs}]}]}


def _no_rendering(core: FakeCore, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the template ran")
    monkeypatch.setattr(core.tok, "encode_chat", refuse)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_references_expanding_past_the_prompt_text_are_a_413_before_rendering(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    core = FakeCore(tiny_model_dir)  # 4096 tokens x 32 bytes: 131,072 characters of text
    _no_rendering(core, monkeypatch)
    client = make_client(core)
    t0 = time.perf_counter()
    r = client.post(path, json=_body(150))  # 150 copies of 100 kB: 15 M characters
    elapsed = time.perf_counter() - t0
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "request_too_large"
    assert "messages.0.content.0.content.1" in r.json()["error"]["message"]  # the second copy
    assert elapsed < 0.5  # well under: the refusal is at the second copy (about 1 ms)
    assert not core.calls


def test_references_within_the_bound_still_expand(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=32768)
    r = make_client(core).post("/v1/messages/count_tokens", json=_body(3, DESC[:10_000]))
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 3 * 4_000  # each copy, where its reference stood


def test_count_tokens_refuses_a_prompt_over_the_window(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=512)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 2000}]}
    r = make_client(core).post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 400, r.text
    assert "prompt is too long" in r.json()["error"]["message"]


class _Limiter:
    def __init__(self) -> None:
        self.charged: list[tuple[str, int | None, bool]] = []

    async def admit(self, key: ApiKeyConfig, tokens: int | None, request: bool = True) -> None:
        self.charged.append((key.name, tokens, request))


def test_count_tokens_is_charged_its_tokens(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    core.auth = Authenticator([ApiKeyConfig(name="alice", key_sha256=hash_key(KEY))])
    core.limiter = _Limiter()  # type: ignore[attr-defined]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
    r = make_client(core).post("/v1/messages/count_tokens", json=body,
                               headers={"x-api-key": KEY})
    assert r.status_code == 200, r.text
    assert core.limiter.charged == [  # type: ignore[attr-defined]
        ("alice", r.json()["input_tokens"], False)]
