"""Requests recorded from the pinned Claude Code and Codex CLIs, replayed through the routes.

The recordings (tests/router/fixtures/, long strings cut) are what the real CLIs sent
on 2026-12-01: Claude Code's system message inside ``messages``, ``thinking``
``adaptive``, ``context_management``, a deferred tool, its session header; Codex's
``additional_tools`` item with namespaces and freeform tools, ``tool_search``,
``web_search``, its session headers. Each must be served on the first try (no 400 for
the CLI to retry without a field), keep turn 1's prompt as turn 2's prefix, and carry
the CLI's session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy.config import KvrouteConfig, ModelConfig
from tests.router.api.anthropic.test_anthropic_api import FakeCore, make_client

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _recorded(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / name).read_text())["requests"]


def _replay(core: FakeCore, rec: dict[str, Any]) -> tuple[int, str]:
    """POST the recorded body (model renamed to the fake's) with its headers."""
    body = {**rec["body"], "model": "tiny"}
    headers = {k: v for k, v in rec["headers"].items() if k not in ("accept-encoding",)}
    resp = make_client(core).post(rec["path"], json=body, headers=headers)
    return resp.status_code, core.prompt_text() if resp.status_code == 200 else resp.text


@pytest.fixture
def claude(tiny_model_dir: Path) -> tuple[FakeCore, list[dict[str, Any]]]:
    return FakeCore(tiny_model_dir, context_window=32768), _recorded("claude_code_2.1.328.json")


def test_claude_code_turns_are_served_with_a_stable_prefix(claude: Any) -> None:
    core, recs = claude
    status1, turn1 = _replay(core, recs[0])
    assert status1 == 200, turn1
    env = recs[0]["body"]["messages"][1]
    assert env["role"] == "system"  # what the CLI really sends (beta mid-conversation…)
    assert "<|im_start|>system\n# Environment" in turn1  # in place, after the first user turn
    assert turn1.index("say hi") < turn1.index("# Environment")
    assert "DeferredToolPlaceholder" not in turn1 and '"name": "ToolSearch"' in turn1
    assert "x-anthropic-billing-header" not in turn1
    status2, turn2 = _replay(core, recs[1])
    assert status2 == 200 and turn2.startswith(turn1), "turn 2 must extend turn 1's prompt"
    session = recs[0]["headers"]["x-claude-code-session-id"]
    assert [c["session_id"] for c in core.calls] == [session, session]


def test_claude_code_tool_result_turn(claude: Any) -> None:
    core, recs = claude
    status, prompt = _replay(core, recs[2])
    assert status == 200, prompt
    assert "<tool_response>\nkvroute-tool-ok\n</tool_response>" in prompt
    assert '"name": "Bash"' in prompt


def test_claude_code_budget_fits_the_context(claude: Any) -> None:
    core, recs = claude
    assert recs[0]["body"]["max_tokens"] == 128000  # more than the model's whole window
    assert _replay(core, recs[0])[0] == 200
    assert core.calls[-1]["sampling"].max_tokens == 32768 - len(core.calls[-1]["ids"])


@pytest.fixture
def codex(tiny_model_dir: Path) -> tuple[FakeCore, list[dict[str, Any]]]:
    return FakeCore(tiny_model_dir, context_window=32768), _recorded("codex_0.169.0.json")


def test_codex_turns_are_served_with_a_stable_prefix(codex: Any) -> None:
    core, recs = codex
    status1, turn1 = _replay(core, recs[0])
    assert status1 == 200, turn1
    assert recs[0]["body"]["input"][0]["type"] == "additional_tools"
    for name in ("functions.exec", "functions.wait", "clock.sleep", "collaboration.list_agents"):
        assert f'"name": "{name}"' in turn1  # namespaced tools in the template's list
    status2, turn2 = _replay(core, recs[1])
    assert status2 == 200 and turn2.startswith(turn1)
    session = recs[0]["headers"]["session-id"]
    assert [c["session_id"] for c in core.calls] == [session, session]


def test_codex_tool_kinds(codex: Any) -> None:
    core, recs = codex
    status, prompt = _replay(core, recs[2])
    assert status == 200, prompt
    assert '"name": "apply_patch"' in prompt and '"name": "tool_search"' in prompt
    assert '"name": "exec_command"' in prompt
    assert "web_search" not in prompt  # offered on every request, never callable here


def test_vendor_model_names_resolve_through_aliases(tiny_model_dir: Path) -> None:
    model = ModelConfig(name="coder", model_path=str(tiny_model_dir))
    cfg = KvrouteConfig(models=[model], aliases={"claude-*": "coder", "gpt-*": "coder"})
    for rec in [*_recorded("claude_code_2.1.328.json"), *_recorded("codex_0.169.0.json")]:
        assert cfg.resolve(rec["body"]["model"]) == {"coder": 1.0}, rec["body"]["model"]
    assert cfg.resolve("llama-3") is None
    with pytest.raises(ValueError, match="not a model or group"):
        KvrouteConfig(models=[model], aliases={"*": "nope"})


def test_claude_code_tool_reference_expands_the_deferred_tool(claude: Any) -> None:
    core, recs = claude
    rec = recs[3]
    assert any(t["name"] == "WebFetch" and t.get("defer_loading") for t in rec["body"]["tools"])
    status, prompt = _replay(core, rec)
    assert status == 200, prompt
    # listed nowhere in the tool list, defined where the search result stands
    assert prompt.count('"name": "WebFetch"') == 1
    assert prompt.index('"name": "WebFetch"') > prompt.index("<tool_response>")
    bad = json.loads(json.dumps(rec))
    bad["body"]["messages"][-1]["content"][0]["content"][0]["tool_name"] = "Nope"
    status, text = _replay(core, bad)
    assert status == 400 and "messages.3.content.0.content.0: tool_reference names 'Nope'" in text


def test_claude_code_sub_agent_gets_its_own_session_key(claude: Any) -> None:
    core, recs = claude
    sub = recs[4]
    assert _replay(core, sub)[0] == 200
    session = sub["headers"]["x-claude-code-session-id"]
    agent = sub["headers"]["x-claude-code-agent-id"]
    assert core.calls[-1]["session_id"] == f"{session}#agent:{agent}"
