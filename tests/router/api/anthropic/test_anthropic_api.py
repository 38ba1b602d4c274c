"""The Anthropic Messages routes with the real anthropic SDK, over a scripted RouterCore.

The routes run for real (parsing, normalisation, the tiny model's chat template and
tokenizer, tool-call parsing, SSE); only ``RouterCore.generate`` is replaced by a
script of recorded engine messages, so every stop reason, usage count and failure
can be produced on demand. ``FakeCore`` and ``make_client`` are shared with
test_tool_calls.py (the OpenAI route).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect

from deploy.config import KvrouteConfig, ModelConfig
from router.api.anthropic import routes as anthropic_routes
from router.api.openai import routes as openai_routes
from router.api.responses import routes as responses_routes
from router.api.responses.store import ResponseStore
from router.auth.bodies import BodyWaits
from router.auth.keys import ApiKeyConfig, Authenticator
from router.errors import ApiError, error_response
from router.prompt.tokenizer import ChatTokenizer
from router.routing.target import Target, Targets
from workers.protocol import Chunk, Final, SamplingParams, Usage, WorkerMessage

HERMES_CALL = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.py"}}\n</tool_call>'
TOOLS = [{"name": "Read", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}}}}]


@dataclass
class Script:
    """What the fake engine does: text chunks, then a final message (or a failure)."""

    chunks: list[str] = field(default_factory=lambda: ["Hello", " there."])
    finish: str = "stop"
    cached: int = 0
    final_extra: dict[str, Any] = field(default_factory=dict)
    fail_after: int | None = None  # raise before this chunk (a replica dying)
    error: ApiError | None = None  # raised by generate itself (e.g. no replica)


class FakeGeneration:
    def __init__(self, script: Script, prompt_tokens: int) -> None:
        self.script, self.prompt_tokens = script, prompt_tokens
        self.model, self.replica, self.router = "tiny", "rep-1", "router-1"
        self.predicted_cached_tokens = 7
        self.request = None  # RouterCore's Generation: what a resume starts from
        self.final: Final | None = None
        self.closed = False

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        try:
            for i, chunk in enumerate(self.script.chunks):
                if self.script.fail_after == i:
                    raise RuntimeError("replica died")
                await asyncio.sleep(0)
                yield Chunk(self.replica, chunk, (i,))
            usage = Usage(self.prompt_tokens, len(self.script.chunks), self.script.cached)
            self.final = Final(self.replica, usage, self.script.finish,
                               **self.script.final_extra)
            yield self.final
        finally:
            self.close()

    def close(self) -> None:
        self.closed = True


class FakeCore:
    def __init__(self, model_dir: Path, script: Script | None = None,
                 context_window: int = 4096) -> None:
        self.models = {"tiny": ModelConfig(name="tiny", model_path=str(model_dir),
                                           context_window=context_window)}
        self.config = KvrouteConfig(models=list(self.models.values()))
        self.tok = ChatTokenizer(str(model_dir))
        self.script = script or Script()
        self.calls: list[dict[str, Any]] = []
        self.gens: list[FakeGeneration] = []
        self.auth = Authenticator([])  # open, like a config without keys
        self.server = self.config.server
        self.body_waits = BodyWaits(self.server.max_body_waits_per_key)
        self.targets = Targets(self.config, {"tiny": self.tok})
        self.predicted_header = True  # RouterCore's: x-kvroute-predicted-cached-tokens
        self.store = ResponseStore(None, "kvroute", ttl_s=60.0, max_entry_bytes=1 << 20,
                                   memory_bytes=8 << 20)
        self.resolved: list[str] = []  # each RouterCore.target call's name

    async def admit(self, headers: Mapping[str, str]) -> ApiKeyConfig | None:
        return self.auth.authenticate(headers)  # no key has a requests/min limit here

    def target(self, model: str, key: ApiKeyConfig | None = None) -> Target:
        self.resolved.append(model)
        return self.targets.resolve(model, key.name if getattr(self, "isolation", False)
                                    and key else None)

    async def generate(self, target: Target, token_ids: list[int], sampling: SamplingParams,
                       request_id: str, headers: Mapping[str, str] | None = None,
                       session_id: str | None = None,
                       api_key: ApiKeyConfig | None = None,
                       has_tools: bool = False) -> FakeGeneration:
        self.calls.append({"ids": token_ids, "sampling": sampling, "session_id": session_id,
                           "api_key": api_key, "headers": dict(headers or {})})
        if self.script.error is not None:
            raise self.script.error
        self.gens.append(FakeGeneration(self.script, len(token_ids)))
        return self.gens[-1]

    def prompt_text(self) -> str:
        return self.tok.decode(self.calls[-1]["ids"])


def make_client(core: FakeCore) -> TestClient:
    app = FastAPI()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return error_response(err, request.url.path)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await anthropic_routes.messages(core, request)  # type: ignore[arg-type]

    @app.post("/v1/messages/count_tokens")
    async def count(request: Request) -> Response:
        return await anthropic_routes.count_tokens(core, request)  # type: ignore[arg-type]

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await openai_routes.chat_completions(core, request)  # type: ignore[arg-type]

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await openai_routes.completions(core, request)  # type: ignore[arg-type]

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await responses_routes.create(core, core.store, request)  # type: ignore[arg-type]

    return TestClient(app, raise_server_exceptions=False)


def _sdk(core: FakeCore) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="x", base_url="http://testserver", max_retries=0,
                               http_client=make_client(core))


def _create(core: FakeCore, **kw: Any) -> Any:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 64,
                            "messages": [{"role": "user", "content": "hi"}]}
    return _sdk(core).messages.create(**{**body, **kw})


def _events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
        assert out[-1][0] == out[-1][1]["type"]
    return out


def test_non_streaming_text_reply(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(cached=5))
    msg = _create(core)
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello there."
    assert (msg.stop_reason, msg.stop_sequence, msg.model) == ("end_turn", None, "tiny")
    prompt = len(core.calls[0]["ids"])
    assert msg.usage.input_tokens == prompt - 5 and msg.usage.cache_read_input_tokens == 5
    assert msg.usage.output_tokens == 2 and msg.usage.cache_creation_input_tokens == 0
    assert core.gens[0].closed


def test_streaming_event_sequence(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["Let me read it.\n", *HERMES_CALL],
                                           cached=3))
    body = {"model": "tiny", "max_tokens": 64, "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "read a.py"}]}
    r = make_client(core).post("/v1/messages", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-kvroute-replica"] == "rep-1"
    events = _events(r.text)
    assert [e for e, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    start = events[0][1]["message"]
    prompt = len(core.calls[0]["ids"])
    assert start["usage"]["input_tokens"] == prompt and start["stop_reason"] is None
    assert start["usage"]["cache_read_input_tokens"] == 0  # known only at the end
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Let me read it."}
    tool = events[5][1]["content_block"]
    assert tool["type"] == "tool_use" and tool["id"].startswith("toolu_") and tool["input"] == {}
    assert events[6][1]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"file_path": "a.py"}
    delta = events[8][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["cache_read_input_tokens"] == 3
    assert delta["usage"]["input_tokens"] == prompt - 3


def test_sdk_stream_accumulates_text_tools_and_usage(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["Ok.", HERMES_CALL], cached=4))
    with _sdk(core).messages.stream(
        model="tiny", max_tokens=64, tools=TOOLS,
        messages=[{"role": "user", "content": "read"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Ok."
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"file_path": "a.py"} and final.content[1].name == "Read"
    assert final.stop_reason == "tool_use"
    assert final.usage.cache_read_input_tokens == 4  # the engine's count, from message_delta


@pytest.mark.parametrize(("script", "kw", "reason", "seq"), [
    (Script(finish="length"), {}, "max_tokens", None),
    (Script(finish="length"), {"max_tokens": 20000}, "model_context_window_exceeded", None),
    (Script(final_extra={"stop_sequence": "END"}), {"stop_sequences": ["END"]},
     "stop_sequence", "END"),
    (Script(chunks=[HERMES_CALL]), {"tools": TOOLS}, "tool_use", None),
    (Script(chunks=[HERMES_CALL]), {"tools": TOOLS, "tool_choice": {"type": "none"}},
     "end_turn", None),
    (Script(chunks=[HERMES_CALL]), {}, "end_turn", None),  # no tools: markup is text
    (Script(chunks=[]), {}, "end_turn", None),
])
def test_stop_reasons(tiny_model_dir: Path, script: Script, kw: dict[str, Any], reason: str,
                      seq: str | None) -> None:
    msg = _create(FakeCore(tiny_model_dir, script), **kw)
    assert (msg.stop_reason, msg.stop_sequence) == (reason, seq)
    assert msg.content  # at least one block, even for an empty reply


def test_sampling_budget_and_session(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=4096)
    _create(core, stop_sequences=["\n\nHuman:"], metadata={"user_id": "user_abc_session_1"})
    call = core.calls[-1]
    assert call["session_id"] == "user_abc_session_1"
    s = call["sampling"]
    assert (s.max_tokens, s.temperature, s.stop) == (64, 1.0, ("\n\nHuman:",))
    _create(core, max_tokens=20000, extra_body={"temperature": 0.0, "top_k": 5},
            extra_headers={"x-session-id": "S", "anthropic-beta": "x", "x-api-key": "k"},
            metadata={"user_id": "U"}, output_config={"effort": "low"})
    call = core.calls[-1]
    assert call["session_id"] == "S"
    assert call["sampling"].max_tokens == 4096 - len(call["ids"])  # cut to fit
    assert call["sampling"].temperature == 0.0


def test_parallel_tool_use_can_be_disabled(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=[HERMES_CALL + "\n" + HERMES_CALL]))
    assert len(_create(core, tools=TOOLS).content) == 2
    msg = _create(core, tools=TOOLS,
                  tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.type for b in msg.content] == ["tool_use"]


def test_count_tokens_matches_what_messages_sends(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    kw: dict[str, Any] = {"system": [{"type": "text", "text": "Be brief."}], "tools": TOOLS,
                          "messages": [{"role": "user", "content": "hi"}]}
    counted = _sdk(core).messages.count_tokens(model="tiny", **kw)
    _create(core, **kw)
    assert counted.input_tokens == len(core.calls[-1]["ids"]) > 0


def test_prefill_continues_the_assistant_turn(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    _create(core, messages=[{"role": "user", "content": "Pick A or B"},
                            {"role": "assistant", "content": "The answer is ("}])
    assert core.prompt_text().endswith("<|im_start|>assistant\nThe answer is (")


def test_mid_stream_failure_sends_an_error_event(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["a", "b", "c"], fail_after=2))
    body = {"model": "tiny", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}
    events = _events(make_client(core).post("/v1/messages", json=body).text)
    assert [e for e, _ in events][-2:] == ["content_block_delta", "error"]
    assert events[-1][1]["error"]["type"] == "api_error"
    assert core.gens[0].closed
    with pytest.raises(anthropic.InternalServerError) as err:  # non-streaming: a 503
        _create(core)
    assert err.value.status_code == 503


def test_disconnect_closes_the_generation(tiny_model_dir: Path) -> None:
    """The stream's body iterator being closed (client gone) closes the generation."""
    core = FakeCore(tiny_model_dir, Script(chunks=["x"] * 100))

    async def run() -> None:
        req = _request({"model": "tiny", "max_tokens": 8, "stream": True,
                        "messages": [{"role": "user", "content": "x"}]})
        resp = await anthropic_routes.messages(core, req)  # type: ignore[arg-type]
        body = resp.body_iterator  # type: ignore[attr-defined]
        for _ in range(4):
            await anext(body)
        await body.aclose()  # what Starlette does when the client disconnects

    asyncio.run(run())
    assert core.gens[0].closed and core.gens[0].final is None


def _request(body: dict[str, Any]) -> Request:
    data = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": [],
             "query_string": b""}
    return Request(scope, receive)


BAD: list[tuple[bytes | dict[str, Any], int, str]] = [
    (b"{not json", 400, "invalid_request_error"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, 400,
     "invalid_request_error"),  # max_tokens is required
    ({"model": "tiny", "max_tokens": 5, "messages": []}, 400, "invalid_request_error"),
    ({"model": "tiny", "max_tokens": 5, "temperature": 1.5,
      "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error"),
    ({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "video", "url": "v"}]}]}, 400, "invalid_request_error"),
    ({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}]}]}, 400, "invalid_request_error"),
    ({"model": "tiny", "max_tokens": 5, "tools": [{"type": "web_search_20250305",
                                                   "name": "web_search"}],
      "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error"),
    ({"model": "tiny", "max_tokens": 5, "output_config": {"format": {"type": "json"}},
      "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 5,
      "messages": [{"role": "user", "content": "x"}]}, 404, "not_found_error"),
    ({"model": "tiny", "max_tokens": 5,
      "messages": [{"role": "user", "content": "word " * 5000}]}, 400, "invalid_request_error"),
]


@pytest.mark.parametrize(("body", "status", "kind"), BAD)
def test_errors_use_anthropic_error_json(tiny_model_dir: Path, body: bytes | dict[str, Any],
                                         status: int, kind: str) -> None:
    core = FakeCore(tiny_model_dir, context_window=1024)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and status == 413:
            continue  # counting a long prompt is fine
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = make_client(core).post(path, content=content,
                                   headers={"content-type": "application/json"})
        if path.endswith("count_tokens") and r.status_code == 200:
            continue  # count_tokens needs no max_tokens / temperature
        assert r.status_code == status, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == kind and err["error"]["message"]
    assert core.calls == []  # no error reached a worker


def test_prompt_too_long_message_and_no_replica(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, context_window=64)
    with pytest.raises(anthropic.APIStatusError) as err:
        _create(core, messages=[{"role": "user", "content": "word " * 200}])
    assert err.value.status_code == 400 and "prompt is too long" in str(err.value)
    core = FakeCore(tiny_model_dir, Script(error=ApiError(503, "no replica", "no_replica")))
    with pytest.raises(anthropic.InternalServerError) as err2:
        _create(core)
    assert err2.value.status_code == 503
    assert err2.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_sdk_raises_typed_errors(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    with pytest.raises(anthropic.NotFoundError):
        _create(core, model="claude-opus-4-1")
    with pytest.raises(anthropic.BadRequestError, match="text-only"):
        _create(core, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}])
    assert isinstance(httpx.Response(200), httpx.Response)


def test_a_client_gone_before_the_first_byte_closes_the_generation(
        tiny_model_dir: Path) -> None:
    """A body generator that never starts never runs its ``finally``;
    the response itself must close the generation (abort, ticket, refund)."""
    core = FakeCore(tiny_model_dir, Script(chunks=["x"] * 100))

    async def run() -> None:
        req = _request({"model": "tiny", "max_tokens": 8, "stream": True,
                        "messages": [{"role": "user", "content": "x"}]})
        resp = await anthropic_routes.messages(core, req)  # type: ignore[arg-type]

        async def gone() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            raise OSError("the client's socket is closed")

        with contextlib.suppress(OSError, ClientDisconnect):
            await resp({"type": "http", "asgi": {"spec_version": "2.4"}}, gone, send)

    asyncio.run(run())
    assert core.gens[0].closed and core.gens[0].final is None
