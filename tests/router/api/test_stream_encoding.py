"""The streams' pre-built byte templates are byte for byte the events built from dicts.

``ChunkEncoder`` (OpenAI chat and completions), ``anthropic.encode.block_delta_template``
and ``responses.encode.delta_template`` (all cut by ``router.api.common.wire.template``)
encode a text delta as fixed bytes around ``json.dumps(text)``; each must equal the
dict-built event it replaces for any text (unicode, escapes, control characters,
JSON-looking and marker-looking strings) and any id, and ``event_batches`` must give
one list per worker message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from router.api.anthropic import encode as aa
from router.api.openai import encode as oa
from router.api.responses import encode as ra
from router.output import events as oe
from router.output import reasoning_parsers as rp
from router.output import tool_calls as tc
from workers.protocol import Chunk, Final, Usage

TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['"', "\\", "\x00", "\x01", "\n\t", "\u2028", "é", "🙂", '{"a":1}', "data: x\n\n",
     "<tool_call>", ""])
IDS = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, rid=IDS, model=IDS, chat=st.booleans())
def test_openai_text_chunk_matches_the_dict_chunk(text: str, rid: str, model: str,
                                                  chat: bool) -> None:
    enc = oa.ChunkEncoder(rid, model, chat)
    want = (oa.chat_chunk(rid, model, {"content": text}, None, enc.created) if chat
            else oa.text_chunk(rid, model, text, None, enc.created))
    assert enc.text(text) == oa.sse(want)
    data = json.loads(enc.text(text).removeprefix(b"data: "))
    assert (data["choices"][0]["delta"]["content"] if chat
            else data["choices"][0]["text"]) == text


def test_openai_encoder_without_a_template_still_encodes() -> None:
    enc = oa.ChunkEncoder("id\x00", "m", chat=True)  # a NUL where the template splits
    assert enc.text("hi") == oa.sse(oa.chat_chunk("id\x00", "m", {"content": "hi"}, None,
                                                  enc.created))


@settings(max_examples=150, deadline=None)
@given(text=TEXT, index=st.integers(0, 1000), kind=st.sampled_from(["text", "thinking"]))
def test_anthropic_block_delta_template(text: str, index: int, kind: str) -> None:
    head, tail = aa.block_delta_template(index, kind)
    assert head + json.dumps(text).encode() + tail == aa.block_delta(index, kind, text)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, seq=st.integers(0, 10**6), item=IDS, index=st.integers(0, 50),
       kind=st.sampled_from(["message", "reasoning"]))
def test_responses_delta_template(text: str, seq: int, item: str, index: int,
                                  kind: str) -> None:
    head, mid, tail = ra.delta_template(kind, item, index)
    got = head + str(seq).encode() + mid + json.dumps(text).encode() + tail
    assert got == ra.text_delta(kind, seq, item, index, text)


def _frames(data: bytes) -> list[bytes]:
    """One write's SSE events, each with its blank line."""
    return [f + b"\n\n" for f in data.split(b"\n\n") if f]


def test_anthropic_blocks_stream_the_dict_events() -> None:
    blocks = aa.Blocks()
    out = _frames(blocks.add("Hé") + blocks.add('"x"') + blocks.add(rp.Reasoning("r")))
    assert [out[1], out[2], out[5]] == [aa.block_delta(0, "text", "Hé"),
                                        aa.block_delta(0, "text", '"x"'),
                                        aa.block_delta(1, "thinking", "r")]
    assert [b["type"] for b in blocks.content] == ["text", "thinking"]


async def _messages(texts: list[str]) -> AsyncIterator[Chunk | Final]:
    for t in texts:
        yield Chunk("r", t, (1,))
    yield Final("r", Usage(1, len(texts), 0), "stop")


def test_event_batches_give_one_list_per_message() -> None:
    async def run(parser: tc.ToolParser | None) -> list[list[oe.Event]]:
        return [b async for b in oe.event_batches(_messages(texts), parser, None)]

    texts = ["Hi ", "", "there <tool_", 'call>{"name": "f", "arguments": {}}</tool_call>']
    assert asyncio.run(run(None)) == [["Hi "], ["there <tool_"],
                                      ['call>{"name": "f", "arguments": {}}</tool_call>']]
    batches = asyncio.run(run(tc.make_parser("hermes")))
    flat = [ev for b in batches for ev in b]
    assert all(batches) and "".join(e for e in flat if isinstance(e, str)) == "Hi there"
    assert [e.name for e in flat if isinstance(e, tc.ToolCall)] == ["f"]


@settings(max_examples=500, deadline=None)
@given(text=st.text())  # any str, lone surrogates included
def test_quote_is_json_dumps(text: str) -> None:
    assert oa.quote(text) == json.dumps(text)


def _answer_reference(chunks: list[str], tools: tc.ToolParser | None,
                      reasoning: rp.ReasoningParser | None) -> list[list[oe.Event]]:
    """``event_batches`` written plainly: every piece through both parsers, in order."""
    def answer(pieces: list[oe.Event]) -> list[oe.Event]:
        out: list[oe.Event] = []
        for p in pieces:
            if isinstance(p, rp.Reasoning) or tools is None:
                out.append(p)
            else:
                out.extend(tools.feed(p))
        return out

    batches = [answer(reasoning.feed(c) if reasoning else [c]) for c in chunks if c]
    tail = answer(reasoning.flush() if reasoning else [])
    tail += tools.flush() if tools else []
    return [b for b in [*batches, tail] if b]  # only lists with events


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.sampled_from(
    [" w1", " ", "\n", "é", "<", "<think>", "</think>", "<tool_", "call>", "<tool_call>",
     '{"name": "f", "arguments": {}}', "</tool_call>", "",
     'a <tool_call>{"name": "g", "arguments": {}}</tool_call>b', "r</think>t"]), max_size=25),
    tools=st.booleans(), reasoning=st.booleans())
def test_event_batches_match_the_plain_definition(chunks: list[str], tools: bool,
                                                  reasoning: bool) -> None:
    def parsers() -> tuple[tc.ToolParser | None, rp.ReasoningParser | None]:
        return (tc.make_parser("hermes") if tools else None,
                rp.SPECS["qwen3"].make(False) if reasoning else None)

    async def run() -> list[list[oe.Event]]:
        return [b async for b in oe.event_batches(_messages(chunks), *parsers())]

    assert asyncio.run(run()) == _answer_reference(chunks, *parsers())


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_anthropic_text_deltas_are_the_dict_events(texts: list[str]) -> None:
    blocks = aa.Blocks()
    sent = [e for t in texts for e in _frames(blocks.add(t))]
    assert [e for e in sent if b"content_block_delta" in e] == [
        aa.block_delta(0, "text", t) for t in texts]
