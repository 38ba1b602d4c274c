"""Responses expansions are bounded before rendering; the store is bounded and owned.

Namespaces and ``additional_tools`` count each function they hold against the tool cap;
a stored conversation counts its whole size (reasoning included) against the text a
prompt may hold, and its messages with the new ones against the message cap. Stored
responses belong to the key that stored them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from router.api.common.limits import MAX_TOOLS
from router.api.responses.store import ResponseStore, StoredResponse
from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from tests.router.api.anthropic.test_anthropic_api import FakeCore, make_client
from tests.router.api.anthropic.test_expansion_bounds import _no_rendering
from tests.router.api.responses.test_responses_api import _post

ALICE, BOB = "a" * 40, "b" * 40


def _fn(i: int) -> dict[str, Any]:
    return {"type": "function", "name": f"f{i}", "parameters": {"type": "object"}}


@pytest.mark.parametrize("shape", ["additional_tools", "namespace"])
def test_tools_past_the_cap_through_expansion_are_a_400_before_rendering(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    core = FakeCore(tiny_model_dir)
    _no_rendering(core, monkeypatch)
    group = [_fn(i) for i in range(512)]
    if shape == "additional_tools":
        body: dict[str, Any] = {"input": [
            *({"type": "additional_tools", "tools": group} for _ in range(3)),
            {"role": "user", "content": "hi"}]}
    else:
        body = {"input": "hi", "tools": [{"type": "namespace", "name": f"ns{n}", "tools": group}
                                         for n in range(3)]}
    t0 = time.perf_counter()
    r = _post(core, body)
    assert time.perf_counter() - t0 < 1.0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "too_many_tools" and str(MAX_TOOLS) in err["message"]
    assert err["param"].startswith("input.2.tools" if shape == "additional_tools" else "tools.2")
    assert not core.calls


def _alice_and_bob(core: FakeCore) -> None:
    core.auth = Authenticator([ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE)),
                               ApiKeyConfig(name="bob", key_sha256=hash_key(BOB))])


def _as(core: FakeCore, key: str, body: dict[str, Any]) -> Any:
    return make_client(core).post("/v1/responses", json={"model": "tiny", **body},
                                  headers={"authorization": f"Bearer {key}"})


def test_another_keys_response_is_not_found_like_an_unknown_id(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    _alice_and_bob(core)
    first = _as(core, ALICE, {"input": "the vault code is 4711"}).json()["id"]
    mine = _as(core, ALICE, {"input": "and?", "previous_response_id": first})
    assert mine.status_code == 200, mine.text
    theirs = _as(core, BOB, {"input": "what was the code?", "previous_response_id": first})
    unknown = _as(core, BOB, {"input": "what was the code?",
                              "previous_response_id": "resp_" + "0" * len(first[5:])})
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["code"] == "response_not_found"
    assert theirs.json()["error"]["message"].replace(first, "X") == \
        unknown.json()["error"]["message"].replace("resp_" + "0" * len(first[5:]), "X")
    assert len(core.calls) == 2  # alice's two turns: nothing of bob's reached a replica


def test_a_stored_conversation_past_a_body_is_a_413_before_rendering(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = FakeCore(tiny_model_dir)  # a body may carry 4096 x 32 + 1 MiB = 1,179,648 B
    core.store = ResponseStore(None, "kvroute", ttl_s=60.0, max_entry_bytes=8 << 20,
                               memory_bytes=64 << 20)
    # Past reasoning no template renders is no longer stored (test_unrendered_reasoning.py),
    # so this entry, 1.4 MB of a conversation's past reasoning, is put in the store as an
    # older version (or a template that renders it, with an output that long) left it.
    turn = {"role": "assistant", "content": "ok", "reasoning_content": "a" * 1_400_000}
    stored = StoredResponse("tiny", [{"role": "user", "content": "hi"}, turn], [], [])
    prev = "resp_stored"
    assert asyncio.run(core.store.put(prev, stored))
    _no_rendering(core, monkeypatch)
    t0 = time.perf_counter()
    r = _post(core, {"input": "hi", "previous_response_id": prev, "store": False})
    assert time.perf_counter() - t0 < 1.0
    assert r.status_code == 413, r.text
    assert r.json()["error"]["param"] == "previous_response_id"
    assert not core.calls


def test_error_messages_clip_the_model_name(tiny_model_dir: Path) -> None:
    core = FakeCore(tiny_model_dir)
    r = _post(core, {"model": "m" * 100_000, "input": "hi"})
    assert r.status_code == 404
    assert len(r.text) < 3000
