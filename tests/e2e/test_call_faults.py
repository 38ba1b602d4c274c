"""A worker replica killed in the middle of a loopback call (``router.start_transport:
loopback``), on real Serve with one router replica and two sim replicas: the cut stream
resumes on the other replica and the client sees one whole answer.

Why its own stack: the stream must be a call, so the router must already know the
replica's loopback address (learned from an earlier request's ``Handoff``). With one
router replica and the same long prompt, prefix routing sends the warm-up requests and the
stream to the same replica; the warm-up that shows up in its ``loopback_calls`` proves
the router took the call path for it. (A kill of a stream started through Serve:
test_faults.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.stacks import counter, deployed, kill_replica, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-call-faults"
PROMPT = "Tell me the long story of the loopback call, chapter by chapter. " * 30


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, replicas=2, tpot_s=0.05)
    with deployed(stack_config(serve_port, model)) as url:
        yield url


def _replicas(url: str) -> dict[str, dict[str, Any]]:
    reps = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"].get(MODEL, [])
    return {r["replica"]: r for r in reps}


def _until(check: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_a_worker_killed_mid_call_resumes_on_the_other(stack: str) -> None:
    _until(lambda: len(_replicas(stack)) == 2, "two worker replicas report")
    warm = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": PROMPT}]}
    served = [httpx.post(f"{stack}/v1/chat/completions", json=warm, timeout=60)
              for _ in range(3)]
    assert all(r.status_code == 200 for r in served)
    replica = served[-1].headers["x-kvroute-replica"]
    assert served[1].headers["x-kvroute-replica"] == replica  # the prefix holder
    _until(lambda: int(_replicas(stack).get(replica, {}).get("loopback_calls", 0)) >= 1,
           "a warm-up request was a loopback call")

    body = {**warm, "max_tokens": 120, "stream": True, "stream_options": {"include_usage": True}}
    resumed = counter(stack, "kvroute_resumed_streams_total")
    events: list[str] = []
    with httpx.stream("POST", f"{stack}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["x-kvroute-replica"] == replica  # known address, idle: a call
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 5:
                    kill_replica(MODEL, replica)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], events[-3:]
    assert chunks[-1]["usage"]["completion_tokens"] == 120
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert counter(stack, "kvroute_resumed_streams_total") == resumed + 1
    after = httpx.post(f"{stack}/v1/chat/completions", json=warm, timeout=60)
    assert after.status_code == 200  # the dead replica's address is not tried forever
