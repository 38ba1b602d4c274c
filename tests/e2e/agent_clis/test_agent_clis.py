"""The real agent CLIs and the OpenAI SDK's Responses client against a real stack.

Ray Serve on loopback, two sim replicas of the tiny model's tokenizer behind the
router, a real redis-server index, and the pinned Claude Code and Codex CLIs
(``make agent-clis``: their npm packages carry the native binaries). The emulator
answers from a script (``workers/engines/sim/script.py``): a tool call in the model's own
format when the last user turn asks for one, a short text otherwise, so each CLI
really runs a tool and sends its result back. A recording proxy sits between each
CLI and kvroute: it shows what the CLI sent (its identity headers) and that no
request failed (a CLI that retries without a field would show a 4xx here). The CLIs'
telemetry and non-essential traffic are off, and their proxy variables point at the
recorder, so nothing they send can leave loopback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.agents import clis
from tests.agents.clis import BIN, MODEL, PLAIN, TOOL_OK
from tests.agents.recorder import Exchange, Recorder
from tests.e2e.test_agents import wait_for, worker_loads

pytestmark = [pytest.mark.slow, pytest.mark.stack(clis.STACK)]


_run, _base_env = clis.run, clis.base_env


# -- Claude Code ----------------------------------------------------------------------

def _claude(rec: Recorder, tmp: Path, *args: str) -> dict[str, Any]:
    env = {**_base_env(tmp / "home", rec.url), "ANTHROPIC_BASE_URL": rec.url,
           "ANTHROPIC_API_KEY": "unused", "DISABLE_TELEMETRY": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1"}
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "project").mkdir(exist_ok=True)
    out = _run([str(BIN / "claude"), "-p", *args, "--output-format", "json"], env,
               tmp / "project")
    return json.loads(out.stdout)


def test_claude_code_two_turns_on_one_replica(recorder: Recorder, tmp_path: Path) -> None:
    first = _claude(recorder, tmp_path, "say hi")
    second = _claude(recorder, tmp_path, "again", "--continue")
    assert not first["is_error"] and not second["is_error"], (first, second)
    calls = recorder.calls("/v1/messages")
    assert not recorder.failures(), [(e.path, e.status) for e in recorder.failures()]
    assert len(calls) == 2 and len({c.replica for c in calls}) == 1, calls
    session = calls[0].headers["x-claude-code-session-id"]
    assert calls[1].headers["x-claude-code-session-id"] == session
    u1, u2 = first["usage"], second["usage"]
    turn1_input = u1["input_tokens"] + u1["cache_read_input_tokens"]
    ratio = u2["cache_read_input_tokens"] / turn1_input
    print(f"\nCLAUDE CODE turn 2 cached {u2['cache_read_input_tokens']} of turn 1's "
          f"{turn1_input} input tokens ({ratio:.1%}), replica {calls[0].replica}")
    recorder.report("CLAUDE CODE")
    assert ratio >= 0.8, (u1, u2)


def test_claude_code_tool_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    result = _claude(recorder, tmp_path, "KVTOOL-CLAUDE run the marker command",
                     "--allowedTools", "Bash")
    assert not result["is_error"] and "All done" in result["result"], result
    calls = recorder.calls("/v1/messages")
    assert not recorder.failures() and len(calls) == 2, calls
    follow_up = calls[1].json()["messages"][-1]["content"]
    results = [b for b in follow_up if b["type"] == "tool_result"]
    assert results and TOOL_OK in json.dumps(results[0]["content"])  # the CLI ran the tool
    assert calls[0].replica == calls[1].replica
    use = calls[1].last_event("message_delta")["usage"]
    prompt = use["input_tokens"] + use["cache_read_input_tokens"]
    assert use["cache_read_input_tokens"] >= 0.8 * prompt, use
    recorder.report("CLAUDE CODE tool round trip")


# -- Codex ------------------------------------------------------------------------------

def _codex_home(tmp: Path, rec: Recorder, model: str) -> Path:
    home = tmp / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(f"""\
model = "{model}"
model_provider = "kvroute"
check_for_update_on_startup = false

[model_providers.kvroute]
name = "kvroute"
base_url = "{rec.url}/v1"
env_key = "KVROUTE_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[features]  # no plugin sync: it would reach out to GitHub and ChatGPT on start
plugins = false
remote_plugin = false
apps = false
plugin_sharing = false
""")
    return home


def _codex(rec: Recorder, tmp: Path, *args: str, model: str = "gpt-6.1-sol"
           ) -> list[dict[str, Any]]:
    env = {**_base_env(tmp / "home", rec.url), "KVROUTE_API_KEY": "unused",
           "CODEX_HOME": str(_codex_home(tmp, rec, model))}
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "project").mkdir(exist_ok=True)
    out = _run([str(BIN / "codex"), "exec", *args], env, tmp / "project")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _codex_usage(events: list[dict[str, Any]]) -> dict[str, int]:
    done = [e for e in events if e.get("type") == "turn.completed"]
    assert done, events
    return done[-1]["usage"]


def test_codex_exec_then_resume_on_one_replica(recorder: Recorder, tmp_path: Path) -> None:
    first = _codex(recorder, tmp_path, "--json", "--skip-git-repo-check", "say hi")
    second = _codex(recorder, tmp_path, "resume", "--last", "--json", "--skip-git-repo-check",
                    "again")
    calls = recorder.calls("/v1/responses")
    assert not recorder.failures(), [(e.path, e.status) for e in recorder.failures()]
    assert len(calls) == 2 and len({c.replica for c in calls}) == 1, calls
    assert calls[0].headers["session-id"] == calls[1].headers["session-id"]
    u1, u2 = _codex_usage(first), _codex_usage(second)
    ratio = u2["cached_input_tokens"] / u1["input_tokens"]
    print(f"\nCODEX turn 2 cached {u2['cached_input_tokens']} of turn 1's "
          f"{u1['input_tokens']} input tokens ({ratio:.1%}), replica {calls[0].replica}")
    recorder.report("CODEX")
    assert ratio >= 0.8, (u1, u2)


def test_codex_tool_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    events = _codex(recorder, tmp_path, "--json", "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                    "KVTOOL-CODEX run the marker command", model="gpt-5.5")
    calls = recorder.calls("/v1/responses")
    assert not recorder.failures() and len(calls) == 2, calls
    outputs = [i for i in calls[1].json()["input"] if i.get("type") == "function_call_output"]
    assert outputs and TOOL_OK in json.dumps(outputs[0]["output"])  # the CLI ran the tool
    assert calls[0].replica == calls[1].replica
    use = calls[1].last_event("response.completed")["response"]["usage"]
    assert use["input_tokens_details"]["cached_tokens"] >= 0.8 * use["input_tokens"], use
    assert any("All done" in json.dumps(e) for e in events), events
    recorder.report("CODEX tool round trip")


def test_codex_sub_agent_round_trip(recorder: Recorder, tmp_path: Path) -> None:
    """``features.multi_agent_v2``: the parent spawns a child (``collaboration.spawn_agent``),
    the child gets its task in an ``agent_message``, runs the marker command and finishes;
    the parent waits and gets the child's final answer back, also an ``agent_message``."""
    events = _codex(recorder, tmp_path, "--json", "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                    "-c", "features.multi_agent_v2=true",
                    "KVTOOL-SPAWN hand the marker command to a sub-agent", model="gpt-5.5")
    calls = recorder.calls("/v1/responses")
    assert not recorder.failures(), [(e.path, e.status) for e in recorder.failures()]
    threads: dict[str, list[Exchange]] = {}
    for c in calls:
        threads.setdefault(c.headers["thread-id"], []).append(c)
    parent = threads.pop(calls[0].headers["thread-id"])
    assert len(threads) == 1, list(threads)  # one child
    (child,) = threads.values()
    assert child[0].headers["x-codex-parent-thread-id"] == calls[0].headers["thread-id"]
    tasks = [i for i in child[0].json()["input"] if i.get("type") == "agent_message"]
    assert tasks and tasks[0]["author"] == "/root", child[0].json()["input"][-2:]
    assert clis.SUB_TASK in json.dumps(tasks[0]["content"])
    outputs = [i for i in child[-1].json()["input"] if i.get("type") == "function_call_output"]
    assert outputs and TOOL_OK in json.dumps(outputs[-1]["output"])  # the child ran the tool
    reports = [i for i in parent[-1].json()["input"] if i.get("type") == "agent_message"
               and i.get("author") == tasks[0]["recipient"]]
    assert reports and "The tool ran. All done." in json.dumps(reports[-1]["content"]), \
        parent[-1].json()["input"][-3:]
    finals = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
              and e["item"].get("type") == "agent_message"]
    assert finals and finals[-1] == clis.SUB_DONE, events  # the parent's turn finished
    assert len({c.replica for c in parent}) == 1 and len({c.replica for c in child}) == 1
    print(f"\nCODEX SUB-AGENT: {len(calls)} requests ({len(parent)} parent, {len(child)} "
          f"child), {len(recorder.failures())} 4xx/5xx, parent on replica "
          f"{parent[0].replica}, child on replica {child[0].replica}")
    recorder.report("CODEX SUB-AGENT")


# -- the OpenAI SDK's Responses client ----------------------------------------------------

def test_openai_sdk_responses_stateless_and_stored(stack: str) -> None:
    client = openai.OpenAI(base_url=f"{stack}/v1", api_key="unused", max_retries=0)
    instructions = "You are a careful assistant. " * 300  # several cache blocks
    first = client.responses.create(model="gpt-5.5", instructions=instructions, input="hi",
                                    store=False, prompt_cache_key="sdk-1")
    assert first.status == "completed" and first.output_text == "Hello from kvroute."
    items: Any = [{"role": "user", "content": "hi"},
                  *[o.model_dump(exclude_none=True) for o in first.output],
                  {"role": "user", "content": "more"}]
    with client.responses.stream(model="gpt-5.5", instructions=instructions, input=items,
                                 store=False, prompt_cache_key="sdk-1") as stream:
        second = stream.get_final_response()
    assert second.usage.input_tokens_details.cached_tokens >= 0.8 * first.usage.input_tokens
    stored = client.responses.create(model=MODEL, instructions=instructions, input="hi")
    follow = client.responses.create(model=MODEL, instructions=instructions, input="more",
                                     previous_response_id=stored.id)
    assert follow.usage.input_tokens > stored.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens >= 0.8 * stored.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_gone")


def test_responses_client_disconnect_aborts_the_worker_request(stack: str) -> None:
    body = {"model": PLAIN, "input": "Write on and on.", "max_output_tokens": 20000,
            "stream": True}
    assert wait_for(lambda: sum(worker_loads(PLAIN).values()) == 0, 15)
    with httpx.stream("POST", f"{stack}/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while "response.output_text.delta" not in next(lines):
            pass
        assert wait_for(lambda: sum(worker_loads(PLAIN).values()) >= 1, 10), worker_loads(PLAIN)
    # 20000 tokens at 10 ms would take minutes: only an abort empties the replica this soon
    assert wait_for(lambda: sum(worker_loads(PLAIN).values()) == 0, 10), worker_loads(PLAIN)
