"""Agents against the real stack: the anthropic and openai SDKs, Ray Serve on loopback,
two mlx-lm CPU replicas of the tiny model, a real redis-server index.

The tiny model has random weights and writes gibberish, so tool calls are checked
end to end as passthrough (tools and tool history reach the template: the counted
prompt matches) and parsing is unit-tested on recorded outputs (test_tool_calls.py).
A replayed Claude Code session (billing-header system block with a new nonce per
request, 80 short tools, growing messages) must reuse the previous turn's cache (kept
compact, about 3k tokens, as CPU MLX prefills the tiny model slowly).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from deploy.config import ModelConfig
from tests.router.api.anthropic.test_normalize import claude_code_request, claude_code_tools
from tests.stacks import deployed, shared_index, stack_config

# the same two mlx replicas and Redis as test_agents/test_mlx: one start for both
pytestmark = [pytest.mark.slow, pytest.mark.stack("mlx-pair")]
MODEL = "tiny-llama"
TOOLS = [{"name": "Read", "description": "Read a file from the local filesystem.",
          "input_schema": {"type": "object", "required": ["file_path"],
                           "properties": {"file_path": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def stack(
    ray_local: None, tiny_model_dir: Path, stack_redis: Any, serve_port: int
) -> Iterator[str]:
    model = ModelConfig(name=MODEL, engine="mlx", model_path=str(tiny_model_dir),
                        num_replicas=2, num_cpus=0.5)
    index = shared_index(stack_redis)
    with deployed(stack_config(serve_port, model, index=index), timeout_s=300) as url:
        yield url


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=400)


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_anthropic_messages_plain_and_streamed(stack: str) -> None:
    client = _anthropic(stack)
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, system="Be brief.",
        messages=[{"role": "user", "content": "Say something."}],
    )
    msg = raw.parse()
    assert msg.id.startswith("msg_") and msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.content[0].type == "text" and msg.usage.output_tokens >= 1
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0
    assert raw.headers["x-kvroute-model"] == MODEL and raw.headers["x-kvroute-replica"]

    with client.messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Stream please."}],
        extra_body={"temperature": 0},
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.usage.output_tokens >= 1 and final.stop_reason in ("end_turn", "max_tokens")


def test_openai_chat_plain_and_streamed_with_tools(stack: str) -> None:
    client = _openai(stack)
    tools: Any = [{"type": "function", "function": {
        "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
        for t in TOOLS]
    resp = client.chat.completions.create(
        model=MODEL, max_tokens=8, tools=tools, seed=1, temperature=0.5,
        messages=[{"role": "user", "content": "Read main.py"}],
    )
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
    without = client.chat.completions.create(
        model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Read main.py"}],
    )
    assert resp.usage.prompt_tokens > without.usage.prompt_tokens + 20  # the tools rendered
    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=8, tools=tools, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Read main.py"}],
    ))
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == \
        resp.usage.prompt_tokens


def test_anthropic_tool_history_passes_through(stack: str) -> None:
    client = _anthropic(stack)
    messages: Any = [
        {"role": "user", "content": "Read main.py"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading it."},
            {"type": "tool_use", "id": "toolu_01", "name": "Read",
             "input": {"file_path": "main.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "print('hi')"}]},
    ]
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=TOOLS)
    msg = client.messages.create(model=MODEL, max_tokens=4, messages=messages, tools=TOOLS,
                                 tool_choice={"type": "auto"})
    prompt = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert prompt == counted.input_tokens
    bare = client.messages.count_tokens(model=MODEL, messages=messages[:1])
    assert counted.input_tokens > bare.input_tokens + 30


def test_claude_code_session_reuses_the_previous_turn(stack: str) -> None:
    client = _anthropic(stack)
    seen: list[tuple[int, int, str]] = []
    for turn, nonce in enumerate(["36ee5", "0aaa9", "97bd6"]):
        body = claude_code_request(turn, nonce, model=MODEL, compact=True)
        body.pop("stream")
        extra = {"temperature": body.pop("temperature")}
        body["max_tokens"] = 8  # Claude Code asks for 32000; the tiny model just babbles
        with client.messages.stream(**body, extra_body=extra,
                                    extra_headers={"anthropic-beta": "claude-code-20250219",
                                                   "anthropic-version": "2023-06-01"}) as s:
            final = s.get_final_message()
            replica = s.response.headers["x-kvroute-replica"]
        u = final.usage
        seen.append((u.input_tokens, u.cache_read_input_tokens or 0, replica))
    assert len(claude_code_tools(compact=True)) == 80
    (in1, cached1, _), (_, cached2, _), (_, cached3, _) = seen
    assert cached2 >= 0.5 * (in1 + cached1), seen
    assert cached3 >= cached2, seen


@pytest.mark.parametrize(("body", "status", "kind"), [
    (b"{not json", 400, "invalid_request_error"),
    (b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_request_error"),
    (b'{"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "robot", '
     b'"content": "x"}]}', 400, "invalid_request_error"),
    (json.dumps({"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user",
     "content": [{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}]}]}
     ).encode(), 400, "invalid_request_error"),
    (b'{"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [{"role": "user", '
     b'"content": "x"}]}', 404, "not_found_error"),
    (json.dumps({"model": "tiny-llama", "max_tokens": 4, "messages": [
        {"role": "user", "content": "alpha beta gamma " * 20000}]}).encode(), 400,
     "invalid_request_error"),  # the prompt alone is over the window: Anthropic's 400
])
def test_anthropic_errors(stack: str, body: bytes, status: int, kind: str) -> None:
    r = httpx.post(f"{stack}/v1/messages", content=body, timeout=60,
                   headers={"content-type": "application/json", "x-api-key": "k",
                            "anthropic-version": "2023-06-01"})
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind and err["error"]["message"]


def test_openai_tool_errors(stack: str) -> None:
    client = _openai(stack)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       tool_choice="sometimes")  # type: ignore[arg-type]
    # A strict schema is enforced while decoding: the reply is an object, and no header says
    # otherwise.
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=16,
        response_format={"type": "json_schema", "json_schema": {"name": "A", "strict": True,
                         "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                    "required": ["ok"], "additionalProperties": False}}},
    )
    assert "x-kvroute-schema-not-enforced" not in raw.headers
    assert json.loads(raw.parse().choices[0].message.content or "") in ({"ok": True},
                                                                         {"ok": False})


@functools.cache
def _worker_handle(model: str) -> Any:
    from ray import serve

    from deploy.serve import runtime

    handle = serve.get_deployment_handle(model, app_name=runtime.APP_NAME)
    handle.load.remote().result(timeout_s=30)  # starts this process's request router
    return handle


def worker_loads(model: str = MODEL) -> dict[str, int]:
    """ongoing_requests per worker replica, from the routing stats Serve pushes every 1 s
    to this process's request router (what the ingress reads too)."""
    from router.routing.views import replica_view

    _worker_handle(model)
    return {r.replica: int(r.stats.get("ongoing_requests", 0)) for r in replica_view(model)}


def wait_for(check: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_client_disconnect_aborts_generation_on_the_worker(stack: str) -> None:
    body = {"model": MODEL, "max_tokens": 20000, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a very long story. " * 3}]}
    probe = httpx.post(f"{stack}/v1/messages", timeout=120,
                       json={**body, "stream": False, "max_tokens": 300}).json()
    assert probe["stop_reason"] == "max_tokens"  # greedy: this prompt does not end early
    assert wait_for(lambda: sum(worker_loads().values()) == 0, 15)
    with httpx.stream("POST", f"{stack}/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while "content_block_delta" not in next(lines):
            pass
        # under way (if the model ended early, it would be 0 here)
        assert wait_for(lambda: sum(worker_loads().values()) >= 1, 10), worker_loads()
    # the client is gone: 20000 tokens would take minutes, an abort takes a moment
    assert wait_for(lambda: sum(worker_loads().values()) == 0, 10), worker_loads()
