"""Interactive Claude Code in auto mode, in a pseudo-terminal, against a real stack.

Interactively (not ``-p``) the pinned CLI starts in auto mode and asks for a safety verdict
on every reply's tool calls (``safeguards`` → ``safeguard_results``,
``router.api.anthropic.safeguards``). The stack (``tests/agents/clis.py``) runs
``safeguards.mode: model`` with the scripted model as its judge. A risky command
(a download piped into a shell) that the judge allows runs with no approval prompt and no
extra requests (the CLI's local-classifier fallback would show as more /v1/messages
calls); one the judge flags is not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents import clis
from tests.agents.recorder import Exchange, Recorder
from tests.agents.terminal import Terminal

pytestmark = [pytest.mark.slow, pytest.mark.stack(clis.STACK)]
APPROVAL = ("needs your approval", "Do you want to proceed", "can't check actions")


def _claude(rec: Recorder, tmp: Path) -> Terminal:
    """The CLI as a user starts it: onboarding done, the folder trusted, auto mode on."""
    home, project = tmp / "home", tmp / "project"
    env = {**clis.base_env(home, rec.url), "TERM": "xterm-256color",
           "ANTHROPIC_BASE_URL": rec.url, "ANTHROPIC_AUTH_TOKEN": "unused",
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
    project.mkdir()
    (home / ".claude").mkdir(parents=True)
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "theme": "dark",
        "projects": {str(project): {"hasTrustDialogAccepted": True}}}))
    (home / ".claude" / "settings.json").write_text(json.dumps({
        "permissions": {"defaultMode": "auto"}, "skipAutoPermissionPrompt": True}))
    term = Terminal([str(clis.BIN / "claude")], env, project)
    term.wait_for(lambda s: "auto mode on" in s, 120, "auto mode at start")
    return term


def _verdict(call: Exchange) -> dict[str, Any]:
    """The one tool call's verdict in the reply's safeguard_results."""
    results = call.last_event("message_delta")["delta"]["safeguard_results"]
    assert [r["type"] for r in results] == ["dangerous_tool_use"], results
    (verdict,) = results[0]["status"]["tool_uses"].values()
    return verdict


def _turn(rec: Recorder, tmp: Path, line: str) -> list[Exchange]:
    """One interactive turn: the user never sees an approval prompt, and the CLI sends its
    two requests (the call, then its result) with no fallback requests and no 4xx/5xx."""
    term = _claude(rec, tmp)
    try:
        term.type_line(line)
        screen = term.wait_for(lambda s: "All done" in s, 180, "the turn's end")
    finally:
        term.close()
    assert not any(a in screen for a in APPROVAL), screen[-3000:]
    calls = rec.calls("/v1/messages")
    assert not rec.failures(), [(e.path, e.status) for e in rec.failures()]
    assert len(calls) == 2, [c.json().get("max_tokens") for c in calls]  # no fallback requests
    return calls


def test_auto_mode_runs_a_judged_risky_command_without_asking(recorder: Recorder,
                                                              tmp_path: Path) -> None:
    calls = _turn(recorder, tmp_path, "KVTOOL-RISKY run the setup script")
    assert all(c.json()["safeguards"][0]["type"] == "dangerous_tool_use" for c in calls)
    assert "dangerous-tool-use-2026-09-03" in calls[0].headers["anthropic-beta"]
    verdict = _verdict(calls[0])
    assert verdict["type"] == "evaluated" and verdict["outcome"] == "not_flagged", verdict
    results = [b for b in calls[1].json()["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert results and clis.TOOL_OK in json.dumps(results[0]["content"])  # it ran, unasked
    assert calls[0].replica == calls[1].replica
    use = calls[1].usage()
    prompt = use["input_tokens"] + use["cache_read_input_tokens"]
    print(f"\nCLAUDE CODE auto mode: {len(calls)} requests, turn 2 cached "
          f"{use['cache_read_input_tokens']} of {prompt}, replica {calls[0].replica}, "
          f"blocked {recorder.blocked}")
    recorder.report("CLAUDE CODE auto mode")
    assert use["cache_read_input_tokens"] >= 0.8 * prompt, use


def test_auto_mode_does_not_run_a_flagged_command(recorder: Recorder, tmp_path: Path) -> None:
    # blocked, not asked. The CLI's own "Blocked by auto mode" line is redrawn in place and
    # can read garbled in the captured screen, so the block itself is checked where the CLI
    # records it: the tool result it sends back
    calls = _turn(recorder, tmp_path, "KVTOOL-FLAGGED run the other setup script")
    verdict = _verdict(calls[0])
    assert verdict["outcome"] == "flagged" and "shell" in verdict["explanation"], verdict
    (result,) = [b for b in calls[1].json()["messages"][-1]["content"]
                 if b["type"] == "tool_result"]
    text = json.dumps(result["content"])
    assert "denied by the Claude Code auto mode classifier" in text, text  # never ran
    assert "Failed to connect" not in text and verdict["explanation"] in text
