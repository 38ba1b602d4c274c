"""POST /v1/responses with the real openai SDK, over a scripted RouterCore.

The route runs for real (parsing, normalisation, the tiny model's chat template and
tokenizer, tool-call parsing, SSE, the response store); only ``RouterCore.generate``
is scripted (``FakeCore`` from test_anthropic_api.py), so each output shape, failure
and usage count can be produced on demand.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from router.api.responses import routes as responses_routes
from tests.router.api.anthropic.test_anthropic_api import (
    HERMES_CALL,
    FakeCore,
    Script,
    _request,
    make_client,
)
from workers.protocol import Constraint

READ_TOOL = {"type": "function", "name": "Read", "description": "Read a file",
             "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}}}


def _sdk(core: FakeCore) -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url="http://testserver/v1", max_retries=0,
                         http_client=make_client(core))


def _post(core: FakeCore, body: dict[str, Any]) -> Any:
    return make_client(core).post("/v1/responses", json={"model": "tiny", **body})


def _events(raw: str) -> list[dict[str, Any]]:
    out = []
    for frame in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        out.append(data)
    return out


def test_text_reply_with_engine_usage(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(cached=5))
    resp = _sdk(core).responses.create(model="tiny", input="hi", instructions="Be brief.")
    assert resp.status == "completed" and resp.output_text == "Hello there."
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    prompt = len(core.calls[-1]["ids"])
    assert resp.usage.input_tokens == prompt and resp.usage.output_tokens == 2
    assert resp.usage.input_tokens_details.cached_tokens == 5
    text = core.prompt_text()
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "hi" in text


def test_stream_event_sequence(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    raw = _post(core, {"input": "hi", "stream": True}).text
    events = _events(raw)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello there."
    assert events[-1]["response"]["usage"]["output_tokens"] == 2


def test_sdk_stream_helper_accumulates_text_and_calls(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["Let me look.", HERMES_CALL]))
    with _sdk(core).responses.stream(model="tiny", input="read a.py",
                                     tools=[READ_TOOL]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["Let me look."]
    assert [o.type for o in final.output] == ["message", "function_call"]
    call = final.output[1]
    assert call.name == "Read" and json.loads(call.arguments) == {"file_path": "a.py"}
    assert call.call_id.startswith("call_")


def test_tool_round_trip_renders_tool_messages(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=[HERMES_CALL]))
    first = _sdk(core).responses.create(model="tiny", input="read a.py", tools=[READ_TOOL],
                                        store=False)
    turn1 = core.prompt_text()
    call = first.output[0]
    assert call.type == "function_call"
    items = [{"role": "user", "content": "read a.py"}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "print(1)"}]
    core.script = Script()
    _sdk(core).responses.create(model="tiny", input=items, tools=[READ_TOOL], store=False)
    turn2 = core.prompt_text()
    assert turn2.startswith(turn1)  # the prefix is stable: turn 1's prompt, then its call
    assert '"name": "Read"' in turn2[len(turn1):]
    assert "<tool_response>\nprint(1)\n</tool_response>" in turn2


def test_previous_response_id_continues_the_stored_conversation(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    sdk = _sdk(core)
    first = sdk.responses.create(model="tiny", input="hi", instructions="Sys.")
    turn1 = core.prompt_text()
    sdk.responses.create(model="tiny", input="and more", instructions="Sys.",
                         previous_response_id=first.id)
    turn2 = core.prompt_text()
    assert turn2.startswith(turn1 + "Hello there.")
    assert turn2.rstrip().endswith("and more<|im_end|>\n<|im_start|>assistant")


def test_unknown_or_unstored_previous_response_is_a_404(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    sdk = _sdk(core)
    unstored = sdk.responses.create(model="tiny", input="hi", store=False)
    for rid in ("resp_nope", unstored.id):
        with pytest.raises(openai.NotFoundError) as err:
            sdk.responses.create(model="tiny", input="x", previous_response_id=rid)
        assert err.value.body["param"] == "previous_response_id"
        assert err.value.body["code"] == "response_not_found"


def test_developer_and_system_messages_are_system_turns(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    items = [{"role": "developer", "content": "Dev rules."},
             {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "zzz"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "hey"}]},
             {"role": "system", "content": "Later note."},
             {"role": "user", "content": "go"}]
    _post(core, {"input": items, "instructions": "Main."})
    text = core.prompt_text()
    assert text.startswith("<|im_start|>system\nMain.\n\nDev rules.<|im_end|>")
    assert "zzz" not in text
    assert "<|im_start|>system\nLater note.<|im_end|>" in text


def test_custom_tools_are_offered_as_functions_and_called_back(tiny_model_dir: Path) -> None:
    call = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin"}}\n</tool_call>'
    core = FakeCore(tiny_model_dir, Script(chunks=[call]))
    tool = {"type": "custom", "name": "apply_patch", "description": "Patch files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}
    body = _post(core, {"input": "patch it", "tools": [tool]}).json()
    assert body["output"][0]["type"] == "custom_tool_call"
    assert body["output"][0]["input"] == "*** Begin"
    assert '"name": "apply_patch"' in core.prompt_text()
    events = _events(_post(core, {"input": "patch it", "tools": [tool], "stream": True}).text)
    assert "response.custom_tool_call_input.delta" in [e["type"] for e in events]


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "banana"}, "input.0"),
    ({"role": "user", "content": [{"type": "input_video"}]}, "input.0.content.0"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
     "input.0.content.0"),
    ({"type": "function_call_output", "call_id": "call_x", "output": "1"}, "input.0.call_id"),
    ({"role": "wizard", "content": "x"}, "input.0.role"),
])
def test_bad_items_are_400s_naming_the_field(tiny_model_dir: Path, item: dict[str, Any],
                                            param: str) -> None:
    core = FakeCore(tiny_model_dir)
    resp = _post(core, {"input": [item]})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"].startswith(param), resp.json()
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert not core.calls


def test_hosted_tools_are_refused_by_type(tiny_model_dir: Path) -> None:
    resp = _post(FakeCore(tiny_model_dir), {"input": "x", "tools": [{"type": "file_search"}]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools.0.type"
    assert "file_search" in resp.json()["error"]["message"]


def test_output_limit_makes_the_response_incomplete(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(finish="length"))
    body = _post(core, {"input": "x", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert core.calls[-1]["sampling"].max_tokens == 2
    events = _events(_post(core, {"input": "x", "stream": True}).text)
    assert events[-1]["type"] == "response.incomplete"


def test_mid_stream_failure_sends_response_failed(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["a", "b", "c"], fail_after=2))
    events = _events(_post(core, {"input": "x", "stream": True}).text)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert core.gens[0].closed
    resp = _post(core, {"input": "x"})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "replica_failed"


def test_disconnect_closes_the_generation(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["x"] * 100))

    async def run() -> None:
        req = _request({"model": "tiny", "input": "x", "stream": True})
        req.scope["path"] = "/v1/responses"
        resp = await responses_routes.create(core, core.store, req)  # type: ignore[arg-type]
        body = resp.body_iterator  # type: ignore[attr-defined]
        for _ in range(5):
            await anext(body)
        await body.aclose()  # what Starlette does when the client disconnects

    asyncio.run(run())
    assert core.gens[0].closed and core.gens[0].final is None


def test_session_key_from_prompt_cache_key_and_codex_header(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    _post(core, {"input": "x", "prompt_cache_key": "conv-1"})
    assert core.calls[-1]["session_id"] == "conv-1"
    make_client(core).post("/v1/responses", json={"model": "tiny", "input": "x",
                                                  "prompt_cache_key": "conv-1"},
                           headers={"session_id": "sess-9"})
    assert core.calls[-1]["session_id"] == "sess-9"  # the CLI's session header first


def test_text_format_json_schema_becomes_a_constraint(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object",
                                                               "required": ["a"]}}
    _post(core, {"input": "x", "text": {"format": fmt}})
    assert "answer" not in core.prompt_text()  # nothing added to the prompt
    assert core.calls[-1]["sampling"].constraint == Constraint(
        "json", '{"type": "object", "required": ["a"]}')
    strict = _post(core, {"input": "x", "text": {"format": {**fmt, "strict": True}}})
    assert strict.status_code == 200 and core.calls[-1]["sampling"].constraint.kind == "json"
