"""Bad input against a real stack: every case is a clear 4xx in the API's own error shape.

Real Ray Serve, one sim-engine replica with a small context window (so a reply that
fills it takes well under a second). Each case names the route, the raw body (bytes,
so invalid JSON and invalid UTF-8 can be sent), the status and, where it is fixed, the
error code. OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}``;
Anthropic routes ``{"type": "error", "error": {"type", "message"}}``.

"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deploy.config import IndexConfig
from router.api.common.request import MAX_BODY_BYTES
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-model"
CONTEXT = 4096
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"
ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error",
                   413: "request_too_large"}

@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, context_window=CONTEXT, default_max_tokens=8,
                      tpot_s=0.0005, prefill_tok_s=1e6)
    with deployed(stack_config(serve_port, model, index=IndexConfig(redis_url=None))) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def assert_error(r: httpx.Response, path: str, status: int, code: str | None = None) -> None:
    """``status`` with the route's API error shape (and OpenAI ``code`` if given)."""
    assert r.status_code == status, f"{path}: {r.status_code} {r.text[:300]}"
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    if path.startswith("/v1/messages"):
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == ANTHROPIC_TYPES[status], body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    else:
        assert set(body) == {"error"}, body
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, body
        assert isinstance(err["message"], str) and err["message"]
        assert err["param"] is None or isinstance(err["param"], str)
        if code is not None:
            assert err["code"] == code, body


def _user(text: str = "hello") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": _user(), "max_tokens": 4, **kw}


def msg(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": _user(), "max_tokens": 4, **kw}


def comp(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **kw}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def raw(template: str, **parts: str) -> bytes:
    """A body written with single quotes, ``<name>`` replaced by ``parts[name]`` verbatim."""
    text = template.replace("'", '"')
    for name, value in parts.items():
        text = text.replace(f"<{name}>", value)
    return text.encode()


def case(name: str, path: str, body: Any, status: int, code: str | None) -> Any:
    """One bad request: ``status`` expected, with OpenAI ``code`` when given."""
    return pytest.param(path, body, status, code, id=name)


_SURROGATE = "hi \\ud800 there"
CASES = [
    case("empty-body-chat", CHAT, b"", 400, "invalid_json"),
    case("empty-body-msg", MESSAGES, b"", 400, None),
    case("not-json", CHAT, b"{model: x", 400, "invalid_json"),
    case("null-body", MESSAGES, b"null", 400, None),
    case("array-body", CHAT, b"[]", 400, "invalid_request"),
    case("string-body", COUNT, b'"x"', 400, None),
    case("invalid-utf8-chat", CHAT, b'{"model": "sim-model", "messages": [{"role": "user", '
     b'"content": "\xff\xfe\xc3("}]}', 400, "invalid_json"),
    case("invalid-utf8-msg", MESSAGES, b'{"model": "\xc0\xaf", "max_tokens": 4, "messages": []}',
     400, None),
    case("nested-10k-top", CHAT, nested(10_000).encode(), 400, "invalid_json"),
    case("nested-10k-tools", CHAT, raw("{'model': 'sim-model', 'messages': [{'role': 'user', "
     "'content': 'x'}], 'tools': [{'function': {'name': 'f', 'parameters': {'x': <n>}}}]}",
                                   n=nested(10_000)), 400, "invalid_json"),
    case("nested-10k-msg", MESSAGES, raw("{'model': 'sim-model', 'max_tokens': 4, 'messages': "
     "[{'role': 'user', 'content': 'x'}], 'metadata': <n>}", n=nested(10_000)), 400, None),
    case("nested-100k-count", COUNT, ("{" + '"a":{' * 100_000).encode(), 400, None),
    case("prompt-too-long-chat", CHAT, chat(messages=_user("w " * 10_000)), 400,
     "context_length_exceeded"),
    case("prompt-too-long-completions", COMPLETIONS, comp(prompt="w " * 10_000), 400,
     "context_length_exceeded"),
    case("prompt-too-long-msg", MESSAGES, msg(messages=_user("w " * 10_000)), 400, None),
    case("text-cannot-fit-chat", CHAT, chat(messages=_user("x" * (CONTEXT * 32 + 1))), 400,
     "context_length_exceeded"),  # refused before tokenizing
    case("max-tokens-zero-chat", CHAT, chat(max_tokens=0), 400, "invalid_request"),
    case("max-tokens-neg-chat", CHAT, chat(max_tokens=-1), 400, "invalid_request"),
    case("max-completion-zero", CHAT, chat(max_completion_tokens=0), 400, "invalid_request"),
    case("max-tokens-zero-msg", MESSAGES, msg(max_tokens=0), 400, None),
    case("max-tokens-neg-msg", MESSAGES, msg(max_tokens=-100), 400, None),
    case("max-tokens-inf", CHAT, raw("{'model': 'sim-model', 'max_tokens': 1e400, 'messages': "
                                 "[{'role': 'user', 'content': 'x'}]}"), 400, "invalid_request"),
    case("temperature-neg-chat", CHAT, chat(temperature=-0.5), 400, "invalid_request"),
    case("temperature-nan-chat", CHAT, raw("{'model': 'sim-model', 'temperature': NaN, "
                                       "'messages': [{'role': 'user', 'content': 'x'}]}"),
     400, "invalid_request"),
    case("temperature-high-msg", MESSAGES, msg(temperature=1.5), 400, None),
    case("top-p-zero-chat", CHAT, chat(top_p=0), 400, "invalid_request"),
    case("top-p-neg-msg", MESSAGES, msg(top_p=-1), 400, None),
    case("top-k-neg-msg", MESSAGES, msg(top_k=-1), 400, None),
    case("n-zero", CHAT, chat(n=0), 400, "invalid_request"),
    case("n-over-openai-bound", CHAT, chat(n=129), 400, "invalid_request"),
    case("best-of-over-n", COMPLETIONS, comp(best_of=3), 400, "invalid_request"),
    case("batch-over-choices", COMPLETIONS, comp(prompt=["a"] * 65, n=2), 400,
         "invalid_request"),
    case("batch-token-id-vocab", COMPLETIONS, comp(prompt=[[1, 2], [1 << 20]]), 400,
         "invalid_token_ids"),
    case("batch-empty-ids", COMPLETIONS, comp(prompt=[[1], []]), 400, "empty_prompt"),
    case("too-many-stops", CHAT, chat(stop=[str(i) for i in range(17)]), 400, "invalid_request"),
    case("too-many-stops-msg", MESSAGES, msg(stop_sequences=[str(i) for i in range(17)]), 400,
     None),
    case("token-id-vocab", COMPLETIONS, comp(prompt=[1, 2, 1 << 20]), 400, "invalid_token_ids"),
    case("token-id-neg", COMPLETIONS, comp(prompt=[-1]), 400, "invalid_token_ids"),
    case("token-id-u32", COMPLETIONS, comp(prompt=[2**32]), 400, "invalid_token_ids"),
    case("token-id-bigint", COMPLETIONS, comp(prompt=[2**70]), 400, "invalid_token_ids"),
    case("token-id-float", COMPLETIONS, comp(prompt=[1.5]), 400, "invalid_request"),
    case("prompt-empty-ids", COMPLETIONS, comp(prompt=[]), 400, "empty_prompt"),
    case("prompt-empty-text", COMPLETIONS, comp(prompt=""), 400, "empty_prompt"),
    case("model-missing", CHAT, {"messages": _user()}, 400, "invalid_request"),
    case("model-empty", MESSAGES, msg(model=""), 400, None),
    case("model-int", CHAT, chat(model=5), 400, "invalid_request"),
    case("model-unknown-chat", CHAT, chat(model="no-such-model"), 404, "model_not_found"),
    case("model-unknown-msg", MESSAGES, msg(model="no-such-model"), 404, None),
    case("model-unknown-count", COUNT, {"model": "nope", "messages": _user()}, 404, None),
    case("messages-string", CHAT, chat(messages="hello"), 400, "invalid_request"),
    case("messages-string-msg", MESSAGES, msg(messages="hello"), 400, None),
    case("messages-empty-chat", CHAT, chat(messages=[]), 400, "invalid_request"),
    case("messages-empty-msg", MESSAGES, msg(messages=[]), 400, None),
    case("messages-empty-count", COUNT, {"model": MODEL, "messages": []}, 400, None),
    case("content-int", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400,
     "invalid_request"),
    case("content-int-msg", MESSAGES, msg(messages=[{"role": "user", "content": 5}]), 400, None),
    case("max-tokens-list", MESSAGES, msg(max_tokens=[4]), 400, None),
    case("stream-object", CHAT, chat(stream={"on": True}), 400, "invalid_request"),
    case("role-unknown-chat", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400,
     "invalid_request"),
    case("role-unknown-msg", MESSAGES, msg(messages=[{"role": "wizard", "content": "x"}]), 400,
         None),
    # a system message inside messages is accepted (Claude Code sends one), text only
    case("system-msg-tool-use", MESSAGES, msg(messages=[
        {"role": "user", "content": "x"}, {"role": "system", "content": [
            {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}]), 400, None),
    case("role-missing", CHAT, chat(messages=[{"content": "x"}]), 400, "invalid_request"),
    case("block-unknown-msg", MESSAGES, msg(messages=[{"role": "user", "content": [
        {"type": "bogus", "text": "x"}]}]), 400, None),
    case("block-image-msg", MESSAGES, msg(messages=[{"role": "user", "content": [
        {"type": "image", "source": {}}]}]), 400, None),
    case("tool-result-in-assistant", MESSAGES, msg(messages=[{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]), 400, None),
    case("server-tool-msg", MESSAGES, msg(tools=[{"type": "web_search_20250305",
                                               "name": "web_search"}]), 400, None),
    case("structured-output-msg", MESSAGES, msg(output_config={"format": {"type": "json"}}), 400,
     None),
    case("surrogate-chat", CHAT, raw(
        "{'model': 'sim-model', 'messages': [{'role': 'user', 'content': '<s>'}]}",
        s=_SURROGATE), 400, None),
    case("surrogate-completions", COMPLETIONS, raw(
        "{'model': 'sim-model', 'prompt': '<s>'}", s=_SURROGATE), 400, None),
    case("surrogate-msg", MESSAGES, raw(
        "{'model': 'sim-model', 'max_tokens': 4, 'messages': [{'role': 'user', "
        "'content': '<s>'}]}", s=_SURROGATE), 400, None),
    case("surrogate-count", COUNT, raw(
        "{'model': 'sim-model', 'messages': [{'role': 'user', 'content': '<s>'}]}",
        s=_SURROGATE), 400, None),
]


@pytest.mark.parametrize(("path", "body", "status", "code"), CASES)
def test_bad_request(client: httpx.Client, path: str, body: Any, status: int,
                     code: str | None) -> None:
    assert_error(post(client, path, body), path, status, code)


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, chat(max_tokens=2**70)), (CHAT, chat(max_tokens=CONTEXT)),
    (CHAT, chat(max_completion_tokens=32000)), (COMPLETIONS, comp(max_tokens=10**30)),
    (MESSAGES, msg(max_tokens=32000))])
def test_an_output_limit_over_the_window_is_cut_to_fit(client: httpx.Client, path: str,
                                                       body: Any) -> None:
    """Not bad input: every API cuts the limit to the room the prompt leaves, and says so."""
    r = post(client, path, body)
    assert r.status_code == 200, r.text[:300]
    assert 0 < int(r.headers["x-kvroute-max-tokens-cut"]) < CONTEXT


def test_the_openai_sdk_asking_32000_gets_a_reply(url: str) -> None:
    """Qwen Code's request shape through the SDK: 32000 on a 4096-token window."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=32000)
    reply = raw.parse()
    assert reply.id.startswith("chatcmpl-") and reply.system_fingerprint
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert int(raw.headers["x-kvroute-max-tokens-cut"]) == CONTEXT - reply.usage.prompt_tokens
    assert client.models.retrieve(MODEL).id == MODEL


def test_a_strict_json_schema_is_enforced(client: httpx.Client) -> None:
    r = post(client, CHAT, chat(max_tokens=8, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {}}}))
    assert r.status_code == 200, r.text[:300]
    assert "x-kvroute-schema-not-enforced" not in r.headers
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)


def test_unknown_block_type_is_named_over_http(client: httpx.Client) -> None:
    r = post(client, MESSAGES, msg(messages=[{"role": "user", "content": [
        {"type": "bogus", "text": "x"}]}]))
    assert_error(r, MESSAGES, 400)
    assert "'bogus'" in r.json()["error"]["message"], r.json()


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, MESSAGES, COUNT])
def test_body_over_the_limit_is_a_fast_413(client: httpx.Client, path: str) -> None:
    filler = b"a" * (MAX_BODY_BYTES + 1)
    body = b'{"model": "sim-model", "prompt": "' + filler + b'"}'
    started = time.monotonic()
    r = post(client, path, body)
    elapsed = time.monotonic() - started
    assert_error(r, path, 413, "body_too_large")
    assert elapsed < 10.0, f"413 took {elapsed:.1f} s"  # ~0.2 s on loopback


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_chunked_body_over_the_limit_is_refused(client: httpx.Client, path: str) -> None:
    """No Content-Length (chunked): the router stops reading at the limit."""
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "sim-model", "prompt": "'
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 1):
            yield b"a" * (1 << 20)
        yield b'"}'

    r = client.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, path, 413, "body_too_large")


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_declared_oversize_is_refused_before_the_body(url: str, path: str) -> None:
    """A Content-Length of 1 GiB gets its 413 without the client sending the body."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
                     f"\r\ncontent-length: {1 << 30}\r\n\r\n{{".encode())
        raw = _read_response(sock)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413"), raw[:300]
    error = json.loads(body)
    code = error["error"].get("code") if path == CHAT else error["error"]["type"]
    assert code == ("body_too_large" if path == CHAT else "request_too_large"), error


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response with a Content-Length, read whole."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, body = raw.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_moderately_nested_tool_schema_is_served(client: httpx.Client, path: str) -> None:
    """Deep JSON (100 levels) inside a free-form field is served; the parser refuses
    nesting past ~200 levels with a 400 (see the deeply nested cases)."""
    schema = json.loads(nested(100))
    body = chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "x": schema}}}]) if path == CHAT else msg(tools=[{
            "name": "f", "input_schema": {"type": "object", "x": schema}}])
    r = post(client, path, body)
    assert r.status_code == 200, r.text[:300]


def test_anthropic_huge_max_tokens_is_cut_to_the_context(client: httpx.Client) -> None:
    """Anthropic's max_tokens is an upper bound (Claude Code asks for 32000): cut to fit."""
    r = post(client, MESSAGES, msg(max_tokens=2**70))
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] <= CONTEXT
    assert body["stop_reason"] in ("model_context_window_exceeded", "end_turn"), body


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, chat(stream=True, max_tokens=0)), (COMPLETIONS, comp(stream=True, prompt=[-5])),
    (MESSAGES, msg(stream=True, messages=[])), (CHAT, chat(stream=True, model="nope")),
])
def test_streamed_bad_requests_fail_before_the_stream(
    client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    r = post(client, path, body)
    assert_error(r, path, 404 if body["model"] == "nope" else 400)


def test_stack_is_healthy_after_the_bad_input(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    r = post(client, CHAT, chat())
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    r = post(client, MESSAGES, msg())
    assert r.status_code == 200 and r.json()["type"] == "message"
