"""The items Codex sends in sub-agent, review and compaction flows are accepted.

An ``agent_message`` (``collaboration.spawn_agent``'s task to a child) renders as a user
message naming its author and recipient, its sealed ``encrypted_content`` parts left out
and its plain ones (the task as a kvroute model wrote it) kept;
items with nothing to render (``compaction``, ``compaction_summary``, ``ghost_snapshot``,
``web_search_call``) are dropped; a ``local_shell_call`` is a call its output can answer.
Each renders the same on the next turn, so the prompt's prefix holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.router.api.anthropic.test_anthropic_api import FakeCore
from tests.router.api.responses.test_responses_api import _post

AGENT_MESSAGE = {"type": "agent_message", "author": "/root", "recipient": "/root/worker",
                 "content": [{"type": "input_text", "text": "Count the files in src/."},
                             {"type": "encrypted_content", "encrypted_content": "gAAAA-sealed"}]}
OPAQUE = [{"type": "compaction", "encrypted_content": "gAAAA-summary"},
          {"type": "compaction_summary", "encrypted_content": "gAAAA-summary"},
          {"type": "ghost_snapshot", "ghost_commit": {"id": "abc", "parent": None}},
          {"type": "web_search_call", "status": "completed",
           "action": {"type": "search", "query": "kvroute"}}]


def _turn(core: FakeCore, items: list[dict[str, Any]]) -> str:
    r = _post(core, {"input": items, "store": False})
    assert r.status_code == 200, r.text
    return core.prompt_text()


def test_agent_message_renders_its_text_and_drops_the_sealed_part(tiny_model_dir: Path
                                                                 ) -> None:
    core = FakeCore(tiny_model_dir)
    prompt = _turn(core, [AGENT_MESSAGE])
    assert "Message from /root to /root/worker:\nCount the files in src/." in prompt
    assert "gAAAA" not in prompt


def test_agent_message_keeps_a_task_the_model_wrote_in_plain_text(tiny_model_dir: Path
                                                                   ) -> None:
    core = FakeCore(tiny_model_dir)  # as Codex 0.169 sends a child its spawn_agent message
    header = "Message Type: NEW_TASK\nTask name: /root/worker\nSender: /root\nPayload:\n"
    task = {**AGENT_MESSAGE, "content": [
        {"type": "input_text", "text": header},
        {"type": "encrypted_content", "encrypted_content": "Count the files in src/."}]}
    assert f"{header}Count the files in src/." in _turn(core, [task])
    sealed = {**AGENT_MESSAGE, "content": [
        {"type": "input_text", "text": header},
        {"type": "encrypted_content", "encrypted_content": "gAAAAABpq3Rk_x-Yz09=="}]}
    assert "gAAAA" not in _turn(core, [sealed])


def test_codex_items_keep_the_prefix_stable(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    first = [AGENT_MESSAGE, *OPAQUE]
    turn1 = _turn(core, first)
    answer = {"role": "assistant", "content": [{"type": "output_text", "text": "12 files."}]}
    turn2 = _turn(core, [*first, answer, {"role": "user", "content": "thanks"}])
    assert turn2.startswith(turn1)
    assert "gAAAA" not in turn2 and "kvroute" not in turn2  # nothing of the dropped items


def test_local_shell_call_is_answered_by_its_output(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    call = {"type": "local_shell_call", "call_id": "sh_1", "status": "completed",
            "action": {"type": "exec", "command": ["ls"]}}
    out = {"type": "function_call_output", "call_id": "sh_1", "output": "a.py"}
    prompt = _turn(core, [{"role": "user", "content": "list"}, call, out])
    assert '"name": "local_shell"' in prompt
    assert "a.py" in prompt


def test_each_child_has_a_session_of_its_own(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    for child in ("child-a", "child-b", "child-a"):  # Codex: one prompt_cache_key per thread
        r = _post(core, {"input": [AGENT_MESSAGE], "store": False, "prompt_cache_key": child})
        assert r.status_code == 200, r.text
    a, b, a_again = (c["session_id"] for c in core.calls)
    assert a == a_again and a != b
