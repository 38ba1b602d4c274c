"""The fan-out's parts on fake replica streams: copies' seeds, the choices' streams
interleaved into one (each chunk with its index, one usage and one ``[DONE]`` at the end),
a failed choice ending the stream, and a whole reply's joined body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from router.api.common import fanout
from router.api.common.flow import Prepared, Turn
from router.api.openai import choices as ch
from router.api.openai import encode as oa
from router.api.openai import routes as openai_routes
from tests.router.dispatch.test_generation import Owner, make
from workers.protocol import Chunk, Final, SamplingParams, Usage


def _events(writes: list[bytes]) -> list[dict[str, Any]]:
    text = b"".join(writes).decode()
    return [json.loads(e) for e in text.removeprefix("data: ").split("\n\ndata: ")
            if e.strip() and e.strip() != "[DONE]"]


def test_a_copy_is_seeded_after_its_index_and_an_unseeded_one_stays_unseeded() -> None:
    sp = SamplingParams(seed=7)
    assert [fanout.seeded(sp, i).seed for i in range(3)] == [7, 8, 9]
    assert fanout.seeded(SamplingParams(), 2).seed is None


def _choices(n: int, prompts: int, fail: int | None = None
             ) -> tuple[list[Turn[Any, None]], list[openai_routes.ChatReply]]:
    turns, replies = [], []
    for k in range(n * prompts):
        msgs: list[Any] = [Chunk("r1", f"c{k}a", (1,)), Chunk("r1", f"c{k}b", (2,))]
        if k != fail:
            msgs.append(Final("r1", Usage(10 + k // n, 2, 8 if k % n else 0), "stop"))
        gen = make(Owner(0, []), "r1", msgs, fail=k == fail)
        p: Prepared[Any, None] = Prepared(None, None, None, None, [1] * 10, None)  # type: ignore[arg-type]
        turns.append(Turn(p, "rid", False, gen, 2, k, n * prompts))
        enc = ch.ChoiceEncoder("chatcmpl-rid", "m", True, "fp_x", k)
        replies.append(openai_routes.ChatReply(gen, oa.ChatOutput(enc), None, None,
                                               "chatcmpl-rid", "m", True, True, "fp_x", k,
                                               part=True))
    return turns, replies


def test_the_choices_stream_as_one_with_their_indices_and_one_usage() -> None:
    turns, replies = _choices(n=2, prompts=2)
    joiner = ch.ChoicesJoiner(turns, replies[0].out.enc, 2, include_usage=True)

    async def run() -> list[bytes]:
        return [w async for w in fanout.merged(list(replies), joiner)]

    writes = asyncio.run(run())
    assert writes[-1].endswith(oa.DONE) and b"".join(writes).count(b"[DONE]") == 1
    events = _events(writes)
    usage = [e for e in events if not e["choices"]]
    assert [u["usage"]["prompt_tokens"] for u in usage] == [10 + 11]  # once per prompt
    assert usage[0]["usage"]["completion_tokens"] == 4 * 2  # every choice's
    assert usage[0]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    for k in range(4):
        mine = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == k]
        assert [c["delta"].get("content") for c in mine] == ["", f"c{k}a", f"c{k}b", None]
        assert mine[-1]["finish_reason"] == "stop"
    assert {e["id"] for e in events} == {"chatcmpl-rid"}


def test_a_failed_choice_ends_the_stream_after_its_error() -> None:
    turns, replies = _choices(n=3, prompts=1, fail=1)
    joiner = ch.ChoicesJoiner(turns, replies[0].out.enc, 3, include_usage=True)

    async def run() -> list[bytes]:
        return [w async for w in fanout.merged(list(replies), joiner)]

    writes = asyncio.run(run())
    assert b"".join(writes).count(b"[DONE]") == 1 and writes[-1] == oa.DONE
    assert any(e.get("error", {}).get("code") == "stream_failed" for e in _events(writes))
    assert replies[1].error and all(r.gen._closed for r in replies)


def test_a_whole_reply_lists_every_choice_in_index_order() -> None:
    turns, replies = _choices(n=2, prompts=1)
    for r in replies:
        r.out.enc = None
    joiner = ch.ChoicesJoiner(turns, None, 2, include_usage=False)

    async def run() -> list[dict[str, Any]]:
        return [await r.collect() for r in replies]

    body = joiner.body(asyncio.run(run()))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == ["c0ac0b", "c1ac1b"]
    assert body["usage"]["prompt_tokens"] == 10 and body["usage"]["completion_tokens"] == 4
