"""``router.app.replica_endpoint.DirectHttp``: a replica's own OpenAI endpoint, with a fake
engine.

The server runs in the test's event loop (as it does in the replica's) on a free
loopback port; requests go over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.app.replica_endpoint import DirectHttp
from router.prompt.tokenizer import ChatTokenizer
from workers.protocol import Chunk, Final, SamplingParams, Usage, WorkerMessage, WorkRequest

MODEL = "tiny-llama"
TOOLS = [{"type": "function", "function": {
    "name": "Read", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


class FakeEngine:
    """Stands in for ``ModelWorker.generate``: scripted text, engine-style usage."""

    def __init__(self, texts: tuple[str, ...] = (" hello", " world"), cached: int = 3,
                 fail: bool = False) -> None:
        self.texts, self.cached, self.fail = texts, cached, fail
        self.requests: list[WorkRequest] = []
        self.closed = 0

    async def generate(self, request: WorkRequest,
                       kvroute_rank: list[str] | None = None) -> AsyncIterator[WorkerMessage]:
        self.requests.append(request)
        try:
            if self.fail:
                raise RuntimeError("engine down")
            for i, text in enumerate(self.texts):
                yield Chunk("r-1", text, (i,))
            usage = Usage(len(request.token_ids), len(self.texts), self.cached)
            yield Final("r-1", usage, "length")
        finally:
            self.closed += 1


@asynccontextmanager
async def serving(model_dir: Path, engine: FakeEngine,
                  token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    direct = DirectHttp(MODEL, str(model_dir), engine.generate, token)
    await direct.start()
    assert direct.address is not None and direct.address.startswith("127.0.0.1:")
    try:
        async with httpx.AsyncClient(base_url=f"http://{direct.address}", timeout=10) as c:
            yield c
    finally:
        await direct.stop()
    assert direct.address is None


def sse(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_info_endpoints_sglang_router_probes(tiny_model_dir: Path) -> None:
    async with serving(tiny_model_dir, FakeEngine()) as c:
        for path in ("/health", "/health_generate"):
            assert (await c.get(path)).status_code == 200
        models = (await c.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info"):
            info = (await c.get(path)).json()
            assert info["model_path"] == str(tiny_model_dir)
        assert (await c.get("/get_load")).json()[0]["num_reqs"] == 0
        assert (await c.post("/flush_cache")).status_code == 200


async def test_completions_token_ids_not_streamed(tiny_model_dir: Path) -> None:
    engine = FakeEngine()
    async with serving(tiny_model_dir, engine) as c:
        r = await c.post("/v1/completions", json={
            "model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 7, "stop": ["x"], "seed": 3})
    assert r.status_code == 200, r.text
    assert r.headers["x-kvroute-replica"] == "r-1"
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " hello world"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 3}}
    sent = engine.requests[0]
    assert sent.token_ids == [5, 6, 7, 8]
    # unset temperature: the model's default (the tiny model's generation_config has none: 1.0)
    assert sent.sampling == SamplingParams(max_tokens=7, temperature=1.0, top_p=1.0,
                                           stop=("x",), seed=3)
    assert engine.closed == 1


async def test_completions_string_prompt_streamed_with_usage(tiny_model_dir: Path) -> None:
    engine = FakeEngine()
    tok = ChatTokenizer(str(tiny_model_dir))
    async with serving(tiny_model_dir, engine) as c:
        r = await c.post("/v1/completions", json={
            "model": MODEL, "prompt": "The morning train", "stream": True,
            "stream_options": {"include_usage": True}})
    events = sse(r.text)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert [e["choices"][0]["text"] for e in events[:2]] == [" hello", " world"]
    assert events[2]["choices"][0]["finish_reason"] == "length"
    assert events[3]["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert events[-1] == "[DONE]"
    assert engine.requests[0].token_ids == tok.encode("The morning train")
    assert engine.requests[0].sampling.max_tokens == 16  # no limit given: OpenAI's and vLLM's


async def test_completions_stream_the_engines_token_ids_when_asked(tiny_model_dir: Path
                                                                  ) -> None:
    """vLLM's ``return_token_ids`` (Dynamo's worker shim): each chunk carries the ids the
    engine generated for it; without it, none do."""
    engine = FakeEngine(texts=(" a", "", " b"))  # the empty chunk's id rides with the next
    async with serving(tiny_model_dir, engine) as c:
        body = {"model": MODEL, "prompt": [5, 6], "stream": True}
        plain = sse((await c.post("/v1/completions", json=body)).text)
        ids = sse((await c.post("/v1/completions",
                                json={**body, "return_token_ids": True})).text)
    assert all("token_ids" not in e["choices"][0] for e in plain[:-1])
    assert [(e["choices"][0]["text"], e["choices"][0]["token_ids"]) for e in ids[:-1]] == [
        (" a", [0]), (" b", [1, 2]), ("", [])]


async def test_chat_is_templated_like_the_router(tiny_model_dir: Path) -> None:
    engine = FakeEngine()
    tok = ChatTokenizer(str(tiny_model_dir))
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Read main.py"}]
    async with serving(tiny_model_dir, engine) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}})
    events = sse(r.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2]
                   if e["choices"]) == " hello world"
    assert events[-2]["usage"]["prompt_tokens"] == len(engine.requests[0].token_ids)
    assert engine.requests[0].token_ids == tok.encode(tok.render(messages, TOOLS))


async def test_chat_tool_calls_are_parsed(tiny_model_dir: Path) -> None:
    call = '<tool_call>\n{"name": "Read", "arguments": {"path": "a.py"}}\n</tool_call>'
    engine = FakeEngine(texts=("Let me look.\n", call))
    async with serving(tiny_model_dir, engine) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Read a.py"}],
            "tools": TOOLS})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"  # the output limit cut it, as the fake says
    assert choice["message"]["content"] == "Let me look."
    fn = choice["message"]["tool_calls"][0]["function"]
    assert fn["name"] == "Read" and json.loads(fn["arguments"]) == {"path": "a.py"}


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("/v1/completions", "not json", 400, "invalid_json"),
    ("/v1/completions", {"model": "other", "prompt": "hi"}, 404, "model_not_found"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 99999]}, 400, "invalid_token_ids"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "empty_prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "invalid_request"),
    # the router fans out n and batched prompts; a replica's own endpoint serves one
    ("/v1/completions", {"model": MODEL, "prompt": [[1], [2]]}, 400, "invalid_request"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 2}, 400, "invalid_request"),
    ("/v1/chat/completions", {"model": MODEL, "n": 2,
                              "messages": [{"role": "user", "content": "hi"}]}, 400,
     "invalid_request"),
])
async def test_bad_requests_get_openai_errors(tiny_model_dir: Path, path: str, body: Any,
                                              status: int, code: str) -> None:
    engine = FakeEngine()
    async with serving(tiny_model_dir, engine) as c:
        if isinstance(body, str):
            r = await c.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = await c.post(path, json=body)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert engine.requests == []


async def test_engine_failure_before_first_token_is_503(tiny_model_dir: Path) -> None:
    async with serving(tiny_model_dir, FakeEngine(fail=True)) as c:
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "replica_failed"


async def test_post_routes_need_the_deployment_token(tiny_model_dir: Path) -> None:
    """Anything on loopback could call the engine past kvroute's keys."""
    engine = FakeEngine()
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 2}
    async with serving(tiny_model_dir, engine, token="t0ken") as c:
        bare = await c.post("/v1/completions", json=body)
        wrong = await c.post("/tokenize", json=body, headers={"Authorization": "Bearer t0kex"})
        probe = await c.get("/get_model_info")
        right = await c.post("/v1/completions", json=body,
                             headers={"Authorization": "Bearer t0ken"})
    assert (bare.status_code, wrong.status_code) == (401, 401)
    assert bare.json()["error"]["code"] == "invalid_api_key"
    assert probe.status_code == 200 and right.status_code == 200
    assert len(engine.requests) == 1  # only the call with the token reached the engine


async def test_stop_releases_the_port(tiny_model_dir: Path) -> None:
    direct = DirectHttp(MODEL, str(tiny_model_dir), FakeEngine().generate)
    await direct.start()
    address = direct.address
    await direct.stop()
    await direct.stop()  # idempotent
    async with httpx.AsyncClient() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://{address}/health")


async def test_render_and_tokenize_give_the_engine_ids(tiny_model_dir: Path) -> None:
    """vllm-router's kv_aware tokenizes through these before routing: they must give the
    ids the engine would get for the same request."""
    engine = FakeEngine()
    messages = [{"role": "user", "content": "Read main.py"}]
    chat = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 5}
    async with serving(tiny_model_dir, engine) as c:
        rendered = (await c.post("/v1/chat/completions/render", json=chat)).json()
        tokenized = (await c.post("/tokenize", json=chat)).json()
        await c.post("/v1/chat/completions", json=chat)
        text = (await c.post("/v1/completions/render",
                             json={"model": MODEL, "prompt": "hello there"})).json()
        plain = (await c.post("/tokenize", json={"prompt": "hello there"})).json()
        bad = await c.post("/tokenize", json={"nothing": 1})
        assert (await c.get("/version")).status_code == 200
    assert rendered["token_ids"] == tokenized["tokens"] == list(engine.requests[0].token_ids)
    assert text[0]["token_ids"] == plain["tokens"] and plain["count"] == len(plain["tokens"]) > 0
    assert bad.status_code == 400 and "error" in bad.json()


class SlowEngine(FakeEngine):
    """A long generation, one chunk every few milliseconds."""

    async def generate(self, request: WorkRequest,
                       kvroute_rank: list[str] | None = None) -> AsyncIterator[WorkerMessage]:
        self.requests.append(request)
        try:
            for i in range(10_000):
                await asyncio.sleep(0.005)
                yield Chunk("r-1", " x", (i,))
            yield Final("r-1", Usage(len(request.token_ids), 10_000, 0), "length")
        finally:
            self.closed += 1


async def test_a_client_gone_mid_stream_aborts_the_engine(tiny_model_dir: Path) -> None:
    engine = SlowEngine()
    direct = DirectHttp(MODEL, str(tiny_model_dir), engine.generate)
    await direct.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{direct.address}", timeout=10) as c:
            body = {"model": MODEL, "prompt": [5, 6], "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    break  # the client leaves after its first bytes
        for _ in range(200):  # the server sees the disconnect at its next write
            if engine.closed and direct.ongoing == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.closed == 1 and direct.ongoing == 0
    finally:
        await direct.stop()
