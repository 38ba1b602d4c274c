"""Bounded work before admission on a real stack: Ray
Serve on loopback, one sim replica of the tiny model's tokenizer, keys on.

A body that cannot fit the context window is refused before it is parsed; counts of
messages and tools are capped; a request is charged to its key's requests/min before its
body is read, so bodies that fail to parse still count, and count_tokens is rate-limited.
``test_hostile_bodies_cost_and_stream_latency`` prints the figures (``pytest -s``)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import ServerConfig
from router.api.common.limits import MAX_MESSAGES, MAX_TOOLS
from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from tests.router.hostile import hostile_tools_body
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-bounded"
FREE, LIMITED = "sk-kvr-free-test-key", "sk-kvr-limited-test-key"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    auth = AuthConfig(api_keys_env="", api_keys=[
        ApiKeyConfig(name="free", key_sha256=hash_key(FREE)),
        ApiKeyConfig(name="limited", key_sha256=hash_key(LIMITED), requests_per_min=2),
    ])
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.01)  # context window 32768
    server = ServerConfig(host="127.0.0.1", port=serve_port, body_read_timeout_s=2.0)
    with deployed(stack_config(serve_port, model, auth=auth).model_copy(
            update={"server": server})) as url:
        yield url


def _post(url: str, path: str, body: bytes | dict, key: str = FREE) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=raw, timeout=120,
                      headers={"content-type": "application/json", "x-api-key": key})


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/v1/messages",
                                  "/v1/chat/completions", "/v1/responses"])
def test_a_body_that_cannot_fit_the_window_is_refused_unparsed(stack: str, path: str) -> None:
    """8 MiB of tools for a 32k-token model: 413 (before: parsed, templated, tokenized)."""
    r = _post(stack, path, hostile_tools_body(MODEL, 8 << 20))
    assert r.status_code == 413, r.text[:300]
    err = r.json()["error"]
    assert (err["type"] if path.startswith("/v1/messages") else err["code"]) in (
        "request_too_large", "body_too_large"), err
    assert err["message"].startswith("request body over"), err  # not after tokenizing


def test_message_and_tool_counts_are_capped(stack: str) -> None:
    many = [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)
    r = _post(stack, "/v1/messages/count_tokens", {"model": MODEL, "messages": many})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"], r.text[:300]
    r = _post(stack, "/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                              "messages": many})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text[:300]
    tools = [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(MAX_TOOLS + 1)]
    r = _post(stack, "/v1/messages/count_tokens", {
        "model": MODEL, "tools": tools, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"], r.text[:300]
    # At the caps the counts pass; what is left is the window, which count_tokens checks
    # as /v1/messages does (10,000 messages and 1,024 tools do not fit a 32k-token model).
    at_caps = _post(stack, "/v1/messages/count_tokens", {
        "model": MODEL, "tools": tools[:MAX_TOOLS], "messages": many[:MAX_MESSAGES]})
    assert at_caps.status_code == 400, at_caps.text[:300]
    assert at_caps.json()["error"]["message"].startswith("prompt is too long"), at_caps.text


def test_requests_are_charged_before_the_body_is_parsed(stack: str) -> None:
    """Key ``limited`` has 2 requests/min: two bodies that are not even JSON use them up
    (before: a 400 was never charged, so unparseable bodies were free), and count_tokens
    counts like any request (before: never rate-limited)."""
    for _ in range(2):
        r = _post(stack, "/v1/messages", b"{not json", key=LIMITED)
        assert r.status_code == 400, r.text
    for path in ("/v1/messages/count_tokens", "/v1/chat/completions"):
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        r = _post(stack, path, body, key=LIMITED)
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1


def test_a_body_that_stops_arriving_is_a_408(stack: str) -> None:
    """Slow bodies: a client that announces 1000 bytes and sends 10 holds no router
    coroutine past ``server.body_read_timeout_s`` (before: it waited for ever)."""
    url = httpx.URL(stack)
    with socket.create_connection((url.host, url.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/messages HTTP/1.1\r\nhost: {url.host}\r\nx-api-key: {FREE}"
                     "\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                     '{"model": '.encode())
        head = _read_response(sock)  # socket.timeout (60 s) before the fix
    assert head.startswith(b"HTTP/1.1 408"), head[:300]
    assert b"request_timeout" not in head and b"invalid_request_error" in head, head


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response: its head and body may arrive in separate segments."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        length = [int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:")]
        if sep and length and len(body) >= length[0]:
            break
    return data
