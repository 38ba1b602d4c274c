"""``router.api.common.flow``: every API's request runs the shared setup once, resolving
its model name into one ``Target`` (the three front ends used to resolve it up to five
times each), and the shared accumulator's rules hold for all three wire formats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router import telemetry
from router.api.anthropic import encode as aa
from router.api.common.output import Output
from router.api.openai import encode as oa
from tests.router.api.anthropic.test_anthropic_api import HERMES_CALL, FakeCore, Script, make_client

OPENAI_TOOLS = [{"type": "function", "function": {
    "name": "Read", "parameters": {"type": "object",
                                   "properties": {"file_path": {"type": "string"}}}}}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "tiny", "max_tokens": 8, "tools": OPENAI_TOOLS,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "tiny", "max_tokens": 8, "prompt": "hi"},
    "/v1/messages": {"model": "tiny", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"model": "tiny",
                                  "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 8},
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", sorted(BODIES))
def test_each_request_resolves_its_model_once(tiny_model_dir: Path, path: str,
                                              stream: bool) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=["Ok ", HERMES_CALL]))
    body = {**BODIES[path], **({"stream": True} if stream and "count" not in path else {})}
    r = make_client(core).post(path, json=body)
    assert r.status_code == 200, r.text
    assert core.resolved == ["tiny"]
    assert len(core.calls) == (0 if "count" in path else 1)


def test_unknown_model_is_a_404_before_any_worker(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    for path, body in BODIES.items():
        r = make_client(core).post(path, json={**body, "model": "nope"})
        assert r.status_code == 404, (path, r.text)
    assert core.calls == [] and core.resolved == ["nope"] * len(BODIES)


class _Recorder(Output):
    """The accumulator's calls, as bytes a test can read."""

    def begin(self, kind: str) -> bytes:
        return f"<{kind}>".encode()

    def delta(self, kind: str, text: str) -> bytes:
        return text.encode()

    def close(self, kind: str) -> bytes:
        return f"</{kind}>".encode()

    def call(self, call: Any, index: int) -> bytes:
        return f"[{call.name}#{index}]".encode()


def _call(name: str) -> Any:
    from router.output.tool_calls import ToolCall
    return ToolCall(name, {})


def test_the_accumulator_switches_pieces_and_keeps_one_call_when_asked() -> None:
    from router.output.reasoning_parsers import Reasoning

    token = telemetry.CURRENT.set(telemetry.RequestInfo())
    try:
        out = _Recorder(single_call=True)
        sent = b"".join(out.add(e) for e in [Reasoning("r1"), Reasoning("r2"), "a", "b",
                                              _call("f"), "c", _call("g")])
        assert sent == b"<reasoning>r1r2</reasoning><text>ab</text>[f#0]<text>c"
        assert telemetry.current().tool_calls == 1 and [c.name for c in out.calls] == ["f"]
        assert out.end_piece() == b"</text>" and out.end_piece() == b""
        many = _Recorder()
        assert b"".join(many.add(e) for e in [_call("f"), _call("g")]) == b"[f#0][g#1]"
        assert telemetry.current().tool_calls == 3
    finally:
        telemetry.CURRENT.reset(token)


def test_the_three_outputs_share_the_single_call_rule() -> None:
    calls = [_call("f"), _call("g")]
    chat = oa.ChatOutput(oa.ChunkEncoder("id", "m", chat=True), single_call=True)
    blocks = aa.Blocks(single_tool=True)
    for out in (chat, blocks):
        assert out.add(calls[0]) and out.add(calls[1]) == b""
        assert [c.name for c in out.calls] == ["f"]
    assert [b["type"] for b in blocks.content] == ["tool_use"]


def test_a_reply_that_cannot_be_built_still_closes_the_generation(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from router.output import tool_calls as tc

    def broken(*_: Any) -> None:
        raise ValueError("no parser")

    monkeypatch.setattr(tc, "parser_for", broken)
    core = FakeCore(tiny_model_dir)
    r = make_client(core).post("/v1/chat/completions", json=BODIES["/v1/chat/completions"])
    assert r.status_code == 500
    assert len(core.gens) == 1 and core.gens[0].closed
