"""The demo's agent model: its script, over the tiny model's real template and tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from deploy.cli import demo
from deploy.cli.main import demo_config
from router.output.tool_calls import family_for_model, make_parser
from router.prompt.tokenizer import ChatTokenizer
from workers.engines.sim.script import SimScript


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "a shell",
                                             "parameters": {"type": "object"}}}


def _reply(chat: ChatTokenizer, script: SimScript, messages: list[dict[str, Any]],
           tools: list[str]) -> str:
    ids = asyncio.run(chat.encode_chat(messages, [_tool(t) for t in tools] or None))
    reply = script.reply_for(ids)
    assert reply is not None
    return "".join(reply.pieces)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[ChatTokenizer, SimScript]:
    path = demo.write_script(tmp_path_factory.mktemp("demo"))
    return ChatTokenizer(str(tiny_model_dir)), SimScript.load(str(path), str(tiny_model_dir))


@pytest.mark.parametrize(("name", "args"), demo.SHELL_TOOLS)
def test_the_trigger_calls_the_clients_own_shell_tool(loaded: Any, tiny_model_dir: Path,
                                                      name: str, args: dict[str, Any]) -> None:
    chat, script = loaded
    text = _reply(chat, script, [{"role": "user", "content": f"please {demo.TRIGGER}"}],
                  ["Read", name, "Write"])
    parser = make_parser(family_for_model(str(tiny_model_dir)))
    calls = [e for e in parser.feed(text) + parser.flush() if not isinstance(e, str)]
    assert [(c.name, c.arguments) for c in calls] == [(name, args)]


def test_plain_turns_and_tool_results_get_an_honest_text(loaded: Any) -> None:
    chat, script = loaded
    assert _reply(chat, script, [{"role": "user", "content": "fix my bug"}], ["Bash"]) == demo.HELLO
    assert "emulator" in demo.HELLO and "not a language model" in demo.HELLO
    after = [{"role": "user", "content": demo.TRIGGER},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
              "function": {"name": "Bash", "arguments": json.dumps({"command": "ls"})}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    assert _reply(chat, script, after, ["Bash"]) == demo.AFTER_TOOL
    # no shell tool offered: nothing to call, the honest text
    assert _reply(chat, script, [{"role": "user", "content": demo.TRIGGER}], []) == demo.HELLO


def test_demo_config_aliases_every_vendor_name_to_the_agent_model() -> None:
    cfg = demo_config("sim", 1)
    assert [m.name for m in cfg.models] == ["tiny-llama", demo.AGENT_MODEL]
    for asked in ("claude-opus-5-5", "gpt-5.5", "qwen3-coder-plus", "coder"):
        assert cfg.resolve(asked) == {demo.AGENT_MODEL: 1.0}
    assert cfg.resolve("tiny-llama") == {"tiny-llama": 1.0}
