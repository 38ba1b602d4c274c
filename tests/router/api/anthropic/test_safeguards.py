"""``safeguards`` → ``safeguard_results``: each mode over the real /v1/messages route.

The request shape is the pinned Claude Code's in auto mode (interactive), as recorded in
tests/router/fixtures/claude_code_2.1.328_auto_mode.json; the answer's shape is the one
that CLI parses (``router.api.anthropic.safeguards``). The engine is the scripted fake of
test_anthropic_api.py; in mode ``model`` the judge's reply is scripted too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from deploy.config import KvrouteConfig, SafeguardsConfig
from router.api.anthropic import safeguards as sg
from tests.router.api.anthropic.test_anthropic_api import (
    HERMES_CALL,
    TOOLS,
    FakeCore,
    FakeGeneration,
    Script,
    make_client,
)
from workers.protocol import WorkerMessage

FIXTURE = Path(__file__).parents[2] / "fixtures" / "claude_code_2.1.328_auto_mode.json"
CALL_TEXT = HERMES_CALL


class SlowGeneration(FakeGeneration):
    async def messages(self) -> AsyncIterator[WorkerMessage]:
        await asyncio.sleep(5)
        async for m in super().messages():
            yield m


class JudgedCore(FakeCore):
    """The reply's scripted generation; a judge's request (the classifier prompt) gets the
    next of ``judge``'s replies."""

    def __init__(self, model_dir: Path, mode: str, judge: list[str] | None = None,
                 slow_judge: bool = False, **fields: Any) -> None:
        super().__init__(model_dir, Script(chunks=[CALL_TEXT]))
        self.config = KvrouteConfig(models=list(self.models.values()),
                                    safeguards=SafeguardsConfig(mode=mode, **fields))
        self.judge, self.slow = list(judge or []), slow_judge

    async def generate(self, *args: Any, **kwargs: Any) -> FakeGeneration:
        gen = await super().generate(*args, **kwargs)
        if sg.CLASSIFIER_PROMPT.splitlines()[0] not in self.tok.decode(self.calls[-1]["ids"]):
            return gen
        script = Script(chunks=[self.judge.pop(0)])
        self.gens[-1] = SlowGeneration(script, 10) if self.slow else FakeGeneration(script, 10)
        return self.gens[-1]


def _body(stream: bool = True, safeguards: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 64, "stream": stream, "tools": TOOLS,
                            "messages": [{"role": "user", "content": "clean up the build"}]}
    if safeguards:
        body["safeguards"] = json.loads(FIXTURE.read_text())["request"]["safeguards"]
    return body


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _post(core: FakeCore, body: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """(the tool_use blocks, the safeguard_results) of one reply, streamed or whole."""
    resp = make_client(core).post("/v1/messages", json=body)
    assert resp.status_code == 200, resp.text
    if not body["stream"]:
        msg = resp.json()
        return [b for b in msg["content"] if b["type"] == "tool_use"], msg.get("safeguard_results")
    events = _events(resp.text)
    uses = [e["content_block"] for e in events if e["type"] == "content_block_start"
            and e["content_block"]["type"] == "tool_use"]
    delta = next(e for e in events if e["type"] == "message_delta")["delta"]
    return uses, delta.get("safeguard_results", None)


def _status(results: Any) -> Mapping[str, Any]:
    assert isinstance(results, list) and len(results) == 1, results
    assert results[0]["type"] == "dangerous_tool_use"
    return results[0]["status"]


def test_no_safeguards_asked_none_answered(tiny_model_dir: Path) -> None:
    core = JudgedCore(tiny_model_dir, "allow")
    assert _post(core, _body(safeguards=False))[1] is None
    assert _post(core, _body(stream=False, safeguards=False))[1] is None


@pytest.mark.parametrize("stream", [True, False])
def test_default_mode_says_no_check_runs(tiny_model_dir: Path, stream: bool) -> None:
    core = FakeCore(tiny_model_dir, Script(chunks=[CALL_TEXT]))
    assert core.config.safeguards.mode == "unavailable"
    uses, results = _post(core, _body(stream))
    assert uses and _status(results) == {"type": "unavailable", "reason": "disabled"}
    assert len(core.calls) == 1  # no side request


@pytest.mark.parametrize(("mode", "outcome"), [("allow", "not_flagged"), ("deny", "flagged")])
def test_fixed_verdicts_name_each_tool_use(tiny_model_dir: Path, mode: str, outcome: str) -> None:
    core = JudgedCore(tiny_model_dir, mode)
    uses, results = _post(core, _body())
    status = _status(results)
    assert status["type"] == "available"
    assert list(status["tool_uses"]) == [u["id"] for u in uses] and len(uses) == 1
    verdict = status["tool_uses"][uses[0]["id"]]
    assert verdict["type"] == "evaluated" and verdict["outcome"] == outcome
    assert mode in verdict["explanation"] and len(core.calls) == 1


def test_a_reply_without_tool_calls_is_available_with_no_verdicts(tiny_model_dir: Path) -> None:
    core = JudgedCore(tiny_model_dir, "model")
    core.script = Script(chunks=["Nothing to run."])
    uses, results = _post(core, _body())
    assert not uses and _status(results) == {"type": "available", "tool_uses": {}}
    assert len(core.calls) == 1


@pytest.mark.parametrize(("said", "outcome"), [("FLAG: it deletes files", "flagged"),
                                               ("ALLOW: routine cleanup", "not_flagged")])
def test_model_mode_asks_the_judge(tiny_model_dir: Path, said: str, outcome: str) -> None:
    core = JudgedCore(tiny_model_dir, "model", [said], max_tokens=20)
    uses, results = _post(core, _body())
    verdict = _status(results)["tool_uses"][uses[0]["id"]]
    assert verdict == {"type": "evaluated", "outcome": outcome,
                       "explanation": said.split(": ", 1)[1]}
    judge = core.calls[1]
    assert judge["sampling"].max_tokens == 20 and judge["session_id"] is None
    text = core.tok.decode(judge["ids"])
    assert sg.CLASSIFIER_PROMPT.splitlines()[0] in text
    assert "clean up the build" in text and '"a.py"' in text  # the ask and the action
    assert '"permission_mode": "auto"' in text  # the client's classifier context


def test_model_mode_unparsed_and_slow_verdicts_are_unavailable(tiny_model_dir: Path) -> None:
    core = JudgedCore(tiny_model_dir, "model", ["maybe?"])
    uses, results = _post(core, _body(stream=False))
    assert _status(results)["tool_uses"][uses[0]["id"]] == {"type": "unavailable",
                                                             "reason": "error"}
    slow = JudgedCore(tiny_model_dir, "model", ["ALLOW: ok"], slow_judge=True, timeout_s=0.2)
    uses, results = _post(slow, _body())
    assert _status(results)["tool_uses"][uses[0]["id"]] == {"type": "unavailable",
                                                             "reason": "timeout"}


def test_parse_verdict() -> None:
    assert sg.parse_verdict("flag - force-pushes main")["outcome"] == "flagged"
    assert sg.parse_verdict(" Allow:") == {"type": "evaluated", "outcome": "not_flagged",
                                                "explanation": "no reason given"}
    assert sg.parse_verdict("ALLOWED") is None and sg.parse_verdict("") is None


def test_config_checks_the_judge_model(tiny_model_dir: Path) -> None:
    models = FakeCore(tiny_model_dir).config.models
    with pytest.raises(ValueError, match="not a model"):
        KvrouteConfig(models=models, safeguards={"mode": "model", "model": "nope"})
    with pytest.raises(ValueError, match="only with"):
        SafeguardsConfig(mode="allow", model="tiny")
    with pytest.raises(ValueError, match="extra"):
        SafeguardsConfig(mode="allow", classifier="x")  # type: ignore[call-arg]


def test_the_recorded_interactive_turns_are_answered(tiny_model_dir: Path) -> None:
    """The CLI's own requests (turn 1, then its tool result): served on the first try,
    each with a verdict, turn 2's prompt extending turn 1's."""
    core = FakeCore(tiny_model_dir, Script(chunks=[CALL_TEXT]), context_window=32768)
    prompts = []
    for rec in json.loads(FIXTURE.read_text())["requests"]:
        headers = {k: v for k, v in rec["headers"].items() if k != "accept-encoding"}
        resp = make_client(core).post(rec["path"], json={**rec["body"], "model": "tiny"},
                                      headers=headers)
        assert resp.status_code == 200, resp.text
        delta = next(e for e in _events(resp.text) if e["type"] == "message_delta")["delta"]
        assert _status(delta["safeguard_results"]) == {"type": "unavailable",
                                                        "reason": "disabled"}
        prompts.append(core.prompt_text())
    assert len(prompts) == 2 and prompts[1].startswith(prompts[0])
