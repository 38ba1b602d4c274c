"""The OpenAI chat stream (``ChatReply.stream``) over a fake replica stream: one write
per worker message that gave events (one event or several: a text and a call), each write
exactly its events' chunks, then the end, usage and ``[DONE]``."""

from __future__ import annotations

import asyncio
import json

from router.api.openai import encode as oa
from router.api.openai import routes as openai_routes
from router.output import tool_calls as tc
from tests.router.dispatch.test_generation import Owner, make
from workers.protocol import Chunk, Final, Usage

CALL = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'


def _events(write: bytes) -> list[dict]:
    return [json.loads(e) for e in write.decode().removeprefix("data: ").split("\n\ndata: ")
            if e.strip() and e.strip() != "[DONE]"]


def test_one_write_per_message_with_its_events() -> None:
    texts = ["Hi", " there", "", " I'll look." + CALL, " after"]
    msgs = [Chunk("r1", t, (i,)) for i, t in enumerate(texts)]
    gen = make(Owner(0, []), "r1", [*msgs, Final("r1", Usage(3, 5, 0), "stop")], fail=False)
    out = oa.ChatOutput(oa.ChunkEncoder("id1", "m", chat=True))
    reply = openai_routes.ChatReply(gen, out, tc.make_parser("hermes"), None, "id1", "m",
                                    chat=True, include_usage=True)

    async def run() -> list[bytes]:
        return [w async for w in reply.stream()]

    writes = asyncio.run(run())
    assert len(writes) == 6  # the role, four messages with events (not the empty one), the end
    deltas = [[c["choices"][0]["delta"] for c in _events(w)] for w in writes[:-1]]
    assert deltas[0] == [{"role": "assistant", "content": ""}]
    assert deltas[1:3] == [[{"content": "Hi"}], [{"content": " there"}]]
    text, call = deltas[3]  # one message, two events, one write
    assert text == {"content": " I'll look."}
    assert call["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert deltas[4] == [{"content": "after"}]  # the space after a call is dropped
    last = _events(writes[-1])
    assert last[0]["choices"][0]["finish_reason"] == "tool_calls" and last[1]["usage"]
    assert writes[-1].endswith(oa.sse("[DONE]"))
