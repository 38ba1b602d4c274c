"""Scripted replies of the sim engine emulator, with the tiny model's tokenizer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from deploy.config import ModelConfig
from router.output.tool_calls import ToolCall, family_for_model, make_parser
from router.prompt.tokenizer import ChatTokenizer
from tests.workers.engines.sim.test_sim_engine import BS, FAST, run
from workers.engines import make_engine
from workers.engines.sim.engine import SimEngine, token_text
from workers.engines.sim.script import SimScript
from workers.protocol import Finished, TokenChunk

TOOL_REPLY = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo kvroute-tool-ok"}}\n'
    "</tool_call>"
)
SCRIPT = {
    "segment_marker": "<|im_start|>user",
    "rules": [
        {"match": "<tool_response>", "reply": "All done."},
        {"match": "TOOLTEST", "reply": TOOL_REPLY},
    ],
}
TOOLS = [{"type": "function", "function": {
    "name": "Bash", "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}}]


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(str(tiny_model_dir))


def write_script(tmp_path: Path, script: Any) -> str:
    path = tmp_path / "script.json"
    path.write_text(script if isinstance(script, str) else json.dumps(script))
    return str(path)


async def scripted_engine(tmp_path: Path, model_dir: Path) -> SimEngine:
    engine = SimEngine("sim/tiny", "r0", BS, FAST,
                       SimScript.load(write_script(tmp_path, SCRIPT), str(model_dir)))
    await engine.start()
    return engine


def encode(chat: ChatTokenizer, messages: list[dict[str, Any]]) -> list[int]:
    return chat.encode(chat.render(messages, tools=TOOLS))


def ids_of(chunks: list[TokenChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def text_of(chunks: list[TokenChunk]) -> str:
    return "".join(c.text for c in chunks)


Ask = Callable[..., Awaitable[tuple[list[TokenChunk], Finished]]]


@pytest.fixture
def ask(tmp_path: Path, tiny_model_dir: Path, chat: ChatTokenizer) -> Ask:
    """Runs one conversation (or one user message) through a fresh scripted engine."""

    async def ask(
        messages: str | list[dict[str, Any]], **sampling: Any
    ) -> tuple[list[TokenChunk], Finished]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        engine = await scripted_engine(tmp_path, tiny_model_dir)
        try:
            return await run(engine, encode(chat, messages), **{"max_tokens": 200, **sampling})
        finally:
            await engine.shutdown()

    return ask


async def test_tool_call_reply_for_the_last_user_message(ask: Ask, chat: ChatTokenizer) -> None:
    chunks, fin = await ask("Please run TOOLTEST now")
    assert text_of(chunks) == TOOL_REPLY and fin.finish_reason == "stop"
    assert fin.usage.completion_tokens == len(chat.encode(TOOL_REPLY)) == len(ids_of(chunks))
    assert ids_of(chunks) == chat.encode(TOOL_REPLY)
    assert chat.decode(ids_of(chunks)) == TOOL_REPLY
    # Streamed: tokens share a chunk only when they were ready together (take_ready).
    assert all(c.token_ids for c in chunks)


async def test_tool_response_gets_the_final_text(ask: Ask, chat: ChatTokenizer) -> None:
    call = {"type": "function", "id": "c1",
            "function": {"name": "Bash", "arguments": {"command": "echo kvroute-tool-ok"}}}
    chunks, fin = await ask([
        {"role": "user", "content": "Please run TOOLTEST now"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "kvroute-tool-ok"},
    ])
    assert text_of(chunks) == "All done." and fin.finish_reason == "stop"
    assert fin.usage.completion_tokens == len(chat.encode("All done."))


async def test_only_the_last_segment_is_matched(ask: Ask) -> None:
    chunks, fin = await ask([
        {"role": "user", "content": "TOOLTEST"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "something else"},
    ], max_tokens=4)
    # No match: the emulator's usual deterministic words.
    assert text_of(chunks) == "".join(token_text(t) for t in ids_of(chunks))
    assert fin.finish_reason == "length" and fin.usage.completion_tokens == 4


async def test_max_tokens_cuts_the_reply(ask: Ask, chat: ChatTokenizer) -> None:
    chunks, fin = await ask("TOOLTEST", max_tokens=3)
    assert fin.finish_reason == "length" and fin.usage.completion_tokens == 3
    assert ids_of(chunks) == chat.encode(TOOL_REPLY)[:3]
    assert text_of(chunks) == chat.decode(chat.encode(TOOL_REPLY)[:3])


async def test_stop_strings_apply_to_the_scripted_text(ask: Ask) -> None:
    chunks, fin = await ask("TOOLTEST", stop=("kvroute-tool",))
    assert fin.finish_reason == "stop" and fin.stop_sequence == "kvroute-tool"
    assert text_of(chunks) == TOOL_REPLY[: TOOL_REPLY.find("kvroute-tool")]


async def test_router_parser_reads_the_scripted_tool_call(ask: Ask, tiny_model_dir: Path) -> None:
    chunks, _ = await ask("TOOLTEST")
    parser = make_parser(family_for_model(str(tiny_model_dir)))
    assert parser is not None
    events = [ev for c in chunks for ev in parser.feed(c.text)] + parser.flush()
    assert events == [ToolCall("Bash", {"command": "echo kvroute-tool-ok"})]


def test_incomplete_utf8_is_held_back(tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    from workers.engines.sim.script import incremental_pieces

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = "naïve → ✓ 日本"
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces = incremental_pieces(tok, ids)
    assert "".join(pieces) == text and len(pieces) == len(ids)
    assert "" in pieces  # a multi-byte character waits for its last byte
    assert not any("\ufffd" in p for p in pieces)


def test_engine_kwargs_script_path(tmp_path: Path, tiny_model_dir: Path) -> None:
    def cfg(**kw: Any) -> ModelConfig:
        return ModelConfig(name="m", engine="sim", model_path=str(tiny_model_dir),
                           engine_kwargs=kw)

    path = write_script(tmp_path, SCRIPT)
    engine = make_engine(cfg(script_path=path, tpot_s=0.001), "r0", BS)
    assert isinstance(engine, SimEngine) and engine.params.tpot_s == 0.001
    with pytest.raises(ValueError, match="nope"):  # refused at config load (SimKwargs)
        cfg(script_path=path, nope=1)
    with pytest.raises(ValueError, match="script_path"):
        cfg(script_path=3)


@pytest.mark.parametrize(("content", "problem"), [
    (None, "No such file"),
    ("{not json", "Expecting property name"),
    ({"rules": [{"match": "(", "reply": "x"}]}, "bad regex"),
    ({"rules": [{"match": "x"}]}, "reply"),
    ({"segment_marker": "u"}, "rules"),
    ({"rules": []}, "rules"),
    ({"rules": [{"match": "x", "reply": "y", "extra": 1}]}, "extra"),
])
def test_invalid_script_files(
    tmp_path: Path, tiny_model_dir: Path, content: Any, problem: str
) -> None:
    path = str(tmp_path / "missing.json") if content is None else write_script(tmp_path, content)
    with pytest.raises(ValueError, match=problem) as info:
        SimScript.load(path, str(tiny_model_dir))
    assert path in str(info.value)


def test_missing_tokenizer_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tokenizer"):
        SimScript.load(write_script(tmp_path, SCRIPT), str(tmp_path))
