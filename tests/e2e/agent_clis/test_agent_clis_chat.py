"""OpenCode, Qwen Code and Cline (the chat-completions agents) against a real stack.

The same scripted stack as the Claude Code and Codex tests (``tests/agents/clis.py``).
Each CLI holds a two-turn session: turn 1 asks for its own shell tool (the script answers
with that tool call, the CLI runs it and sends the result back), turn 2 continues the
session (Cline: one task, whose second model turn is the tool result's; its CLI resumes
a session only in its terminal UI). Through the recording proxy: no response is a
4xx/5xx, every request of the session lands on one replica, and turn 2 reads at least
80% of its prompt from the engine's cache (``usage.prompt_tokens_details.cached_tokens``,
the engine's count).
Telemetry, update checks and model catalogues are off; every proxy variable points at
the recorder, which refuses any host but loopback (``Recorder.blocked`` lists them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agents import clis
from tests.agents.clis import BIN, TOOL_OK
from tests.agents.recorder import Exchange, Recorder

pytestmark = [pytest.mark.slow, pytest.mark.stack(clis.STACK)]
CHAT = "/v1/chat/completions"


def _session(rec: Recorder, client: str, turns: list[Callable[[], str]]) -> None:
    """Run each turn (it returns the CLI's final text), then check item by item."""
    assert turns, client
    per_turn: list[list[Exchange]] = []
    walls = []
    for turn in turns:
        before, started = len(rec.calls(CHAT)), time.monotonic()
        text = turn()
        walls.append(time.monotonic() - started)
        per_turn.append(rec.calls(CHAT)[before:])
        assert text, f"{client}: no answer"
    calls = rec.calls(CHAT)
    assert not rec.failures(), [(e.path, e.status) for e in rec.failures()]
    sent = json.dumps([m for c in calls for m in c.json()["messages"] if m["role"] == "tool"])
    assert TOOL_OK in sent, f"{client} never sent the tool's output back"
    # turn 2's first request (one turn: the tool result's request), on the session's prefix
    main = per_turn[1][0] if len(per_turn) > 1 else per_turn[0][1]
    use = main.usage()
    ratio = use["prompt_tokens_details"]["cached_tokens"] / use["prompt_tokens"]
    # the session's requests open with its system prompt; a side request with a prompt of its
    # own (OpenCode's title) shares no prefix with it, so it may go to any replica
    head = main.json()["messages"][:1]
    session = [c for c in calls if c.json()["messages"][:1] == head]
    replicas = {c.replica for c in session}
    print(f"\n{client}: {len(calls)} requests ({len(calls) - len(session)} side), "
          f"{len(rec.failures())} 4xx/5xx, turn 2 cached {ratio:.1%} of {use['prompt_tokens']}, "
          f"session replicas {sorted(replicas)}, wall per turn "
          + ", ".join(f"{w:.1f} s" for w in walls) + f"; blocked {rec.blocked or 'none'}")
    rec.report(client)
    assert len(replicas) == 1, replicas
    assert ratio >= 0.8, use


# -- Qwen Code ----------------------------------------------------------------------------

def test_qwen_code_session_with_a_tool_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    _session(recorder, "QWEN CODE", [
        lambda: clis.qwen(recorder.url, tmp_path, "KVTOOL-QWEN run the marker command")[0],
        lambda: clis.qwen(recorder.url, tmp_path, "--continue", "again")[0]])


# -- OpenCode -----------------------------------------------------------------------------

def _opencode(rec: Recorder, tmp: Path, *args: str) -> str:
    project = tmp / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "opencode.json").write_text(json.dumps({
        "autoupdate": False, "share": "disabled", "model": "kvroute/coder",
        "provider": {"kvroute": {
            "npm": "@ai-sdk/openai-compatible", "name": "kvroute",
            "options": {"baseURL": f"{rec.url}/v1", "apiKey": "unused"},
            "models": {"coder": {"name": "coder", "tool_call": True,
                                 "limit": {"context": 32768, "output": 4096}}}}}}))
    env = {**clis.base_env(tmp / "home", rec.url), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_SHARE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}
    out = clis.run([str(BIN / "opencode"), "run", "--auto", "--format", "json", *args], env,
                   project)
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("type") == "error"], out.stdout[-2000:]
    return "".join(e["part"]["text"] for e in events if e.get("type") == "text")


def test_opencode_session_with_a_tool_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    _session(recorder, "OPENCODE", [
        lambda: _opencode(recorder, tmp_path, "KVTOOL-OPENCODE run the marker command"),
        lambda: _opencode(recorder, tmp_path, "--continue", "again")])
    assert all(c.headers.get("x-session-affinity") for c in recorder.calls(CHAT))


# -- Cline --------------------------------------------------------------------------------

def _cline(rec: Recorder, tmp: Path, *args: str) -> tuple[str, str]:
    """(the final text, the task id) of one ``cline --json`` run."""
    env = clis.base_env(tmp / "home", rec.url)
    if not (tmp / "home" / ".cline").exists():
        clis.run([str(BIN / "cline"), "auth", "-p", "openai", "-k", "unused", "-m", "coder",
                  "-b", f"{rec.url}/v1"], env, tmp / "project")
    out = clis.run([str(BIN / "cline"), "--json", *args], env, tmp / "project")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    done = [e for e in events if e.get("type") == "run_result"]
    assert done and done[-1]["finishReason"] == "completed", out.stdout[-2000:]
    task = next(e["taskId"] for e in events if e.get("taskId"))
    return str(done[-1]["text"]), str(task)


def test_cline_task_with_a_tool_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    """One task, two model turns (the call, then its result): the CLI resumes a session
    (``--id``) only in its terminal UI, so the second turn here is the tool result's."""
    _session(recorder, "CLINE", [
        lambda: _cline(recorder, tmp_path, "KVTOOL-CLINE run the marker command")[0]])
