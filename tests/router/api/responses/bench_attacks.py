"""The second security review's expansion and store attacks, measured in process.

Not a test (pytest does not collect it): it prints one JSON line per case, with the
answer's status, process CPU time and the peak RSS's growth, over the scripted core of
the API tests (the real parse, normalisation, template and tokenizer of the tiny model,
a 32,768-token window; only ``RouterCore.generate`` scripted). One case per process, so
each RSS peak is its own:

    PYTHONPATH=<tree> .venv/bin/python tests/router/api/responses/bench_attacks.py CASE

CASE: toolref_messages, toolref_count, tools_additional, tools_namespace, store, owner,
model_name. The figures are in docs/reliability.md; the tests assert only the refusals.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.models.tiny_model import ensure_model
from router.api.responses.store import ResponseStore
from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from tests.router.api.anthropic.test_anthropic_api import FakeCore, make_client

DIR = ensure_model(Path("/tmp/kvroute-bench-cache"))
DESC = ("lorem ipsum 1 dolor sit amet " * 4000)[:100_000]  # the longest description allowed


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(case: str, fn: Callable[[], dict[str, Any]]) -> None:
    base, c0 = _rss_mib(), time.process_time()
    out = fn()
    print(json.dumps({"case": case, **out, "cpu_s": round(time.process_time() - c0, 3),
                      "peak_rss_delta_mib": round(_rss_mib() - base, 1)}))


def _post(core: FakeCore, path: str, body: dict[str, Any],
          headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = make_client(core).post(path, json=body, headers=headers or {})
    return {"status": r.status_code, "body_bytes": len(json.dumps(body)),
            "answer_bytes": len(r.content), "answer": r.text[:120]}


def toolref(path: str, refs: int) -> Callable[[], dict[str, Any]]:
    core = FakeCore(DIR, context_window=32768)
    body = {"model": "tiny", "max_tokens": 1,
            "tools": [{"name": "t", "description": DESC, "input_schema": {"type": "object"},
                       "defer_loading": True}],
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "u",
                 "content": [{"type": "tool_reference", "tool_name": "t"}] * refs}]}]}
    return lambda: _post(core, path, body)


def tools(shape: str) -> Callable[[], dict[str, Any]]:
    core = FakeCore(DIR, context_window=32768)
    group = [{"type": "function", "name": f"f{i}", "parameters": {"type": "object"}}
             for i in range(512)]
    body: dict[str, Any] = {"model": "tiny", "input": "hi"}
    if shape == "additional":
        body["input"] = [*({"type": "additional_tools", "tools": group} for _ in range(20)),
                         {"role": "user", "content": "hi"}]
    else:
        body["tools"] = [{"type": "namespace", "name": f"ns{n}", "tools": group}
                         for n in range(20)]
    return lambda: _post(core, "/v1/responses", body)


def store(turns: int) -> Callable[[], dict[str, Any]]:
    """``turns`` turns of a 1.9 MB reasoning item each, then a 134-byte continuation."""
    core = FakeCore(DIR, context_window=32768)  # a body may carry 2 MiB
    core.store = ResponseStore(None, "kvroute", 86400.0, 16 << 20, 256 << 20)  # the defaults
    thought = {"type": "reasoning", "content": [{"type": "reasoning_text",
                                                 "text": "a" * 1_900_000}]}
    prev, statuses, client = None, [], make_client(core)
    for _ in range(turns):
        r = client.post("/v1/responses", json={
            "model": "tiny", "max_output_tokens": 1, "previous_response_id": prev,
            "input": [thought, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "hi"}]})
        statuses.append(r.status_code)
        if r.status_code != 200:
            break
        prev = r.json()["id"]
    blob = core.store._local[prev][1] if prev in core.store._local else b""

    def go() -> dict[str, Any]:
        out = _post(core, "/v1/responses", {"model": "tiny", "input": "hi", "store": False,
                                            "max_output_tokens": 1,
                                            "previous_response_id": prev})
        return {"turns": statuses, "entry_compressed": len(blob),
                "entry_raw": len(zlib.decompress(blob)) if blob else 0, **out}
    return go


def owner() -> Callable[[], dict[str, Any]]:
    core = FakeCore(DIR)
    core.auth = Authenticator([ApiKeyConfig(name="alice", key_sha256=hash_key("a" * 40)),
                               ApiKeyConfig(name="bob", key_sha256=hash_key("b" * 40))])
    alice, bob = ({"authorization": f"Bearer {k * 40}"} for k in "ab")
    rid = make_client(core).post("/v1/responses", json={"model": "tiny", "input": "code 4711"},
                                 headers=alice).json()["id"]
    return lambda: _post(core, "/v1/responses", {"model": "tiny", "input": "code?",
                                                 "previous_response_id": rid}, bob)


def model_name() -> Callable[[], dict[str, Any]]:
    core = FakeCore(DIR)
    return lambda: _post(core, "/v1/chat/completions", {
        "model": "m" * 1_000_000, "messages": [{"role": "user", "content": "x"}]})


CASES: dict[str, Callable[[], Callable[[], dict[str, Any]]]] = {
    "toolref_messages": lambda: toolref("/v1/messages", 150),
    "toolref_count": lambda: toolref("/v1/messages/count_tokens", 40),
    "tools_additional": lambda: tools("additional"),
    "tools_namespace": lambda: tools("namespace"),
    "store": lambda: store(5), "owner": owner, "model_name": model_name}

if __name__ == "__main__":
    _run(sys.argv[1], CASES[sys.argv[1]]())
