"""A ``strict: true`` JSON schema (chat ``response_format``, Responses ``text.format``) is
served with the schema as an instruction and a header saying it was not enforced (the
engines do not constrain decoding yet), not refused: the Codex TUI sends one with every new
thread's title request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from router.api.openai.schema import SCHEMA_NOT_ENFORCED
from tests.router.api.anthropic.test_anthropic_api import FakeCore, Script, make_client

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
          "required": ["title"], "additionalProperties": False}


def _chat(core: FakeCore, strict: bool) -> Any:
    fmt = {"type": "json_schema", "json_schema": {"name": "Title", "schema": SCHEMA,
                                                  "strict": strict}}
    return make_client(core).post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "response_format": fmt})


def test_a_strict_chat_schema_is_an_instruction_and_a_header(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=['{"title": "t"}']))
    r = _chat(core, strict=True)
    assert r.status_code == 200, r.text
    assert r.headers[SCHEMA_NOT_ENFORCED] == "Title"
    assert "conforming to this JSON schema (Title)" in core.prompt_text()
    assert SCHEMA_NOT_ENFORCED not in _chat(core, strict=False).headers


def test_the_codex_title_request_with_a_strict_text_format(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=['{"title": "t"}']))
    fmt = {"type": "json_schema", "name": "codex_output_schema", "schema": SCHEMA,
           "strict": True}
    body = {"model": "tiny", "input": "Name this thread", "stream": True,
            "text": {"format": fmt}, "store": False}
    r = make_client(core).post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.headers[SCHEMA_NOT_ENFORCED] == "codex_output_schema"
    assert "conforming to this JSON schema (codex_output_schema)" in core.prompt_text()


def test_the_openai_sdk_parses_a_strict_schema_reply(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=['{"title": "t"}']))
    client = openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                           http_client=make_client(core))
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "Title", "schema": SCHEMA, "strict": True}})
    assert out.choices[0].message.content == '{"title": "t"}'
