"""Faults under load on real Serve (sim engine): a worker replica killed mid-stream
costs that stream nothing (it resumes on the other replica) while new requests keep
succeeding; a router replica killed leaves the other serving."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import RouterConfig
from deploy.serve.builder import ROUTER_DEPLOYMENT
from tests.stacks import counter, deployed, kill_replica, report_fault, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-faults"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, replicas=2, tpot_s=0.05)
    with deployed(stack_config(serve_port, model, router=RouterConfig(replicas=2))) as url:
        yield url


def _ok(url: str, text: str = "hello") -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_killed_worker_stream_resumes_on_the_other_replica(stack: str) -> None:
    body = {"model": MODEL, "max_tokens": 120, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "a long story please"}]}
    events: list[str] = []
    resumed = counter(stack, "kvroute_resumed_streams_total")
    t0 = time.monotonic()
    with httpx.stream("POST", f"{stack}/v1/chat/completions", json=body, timeout=60) as r:
        replica = r.headers["x-kvroute-replica"]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 5:
                kill_replica(MODEL, replica)
    elapsed = time.monotonic() - t0
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], events[-3:]
    usage = chunks[-1]["usage"]  # counted against the original prompt, all 120 tokens out
    assert usage["completion_tokens"] == 120, usage
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert counter(stack, "kvroute_resumed_streams_total") == resumed + 1
    retries = counter(stack, "kvroute_retries_total")
    survivors, worst = _timed(lambda i: _ok(stack, f"after the kill {i}"), 10)
    assert all(s.status_code == 200 for s in survivors)
    report_fault("worker killed mid-stream (the cut stream, then 10 more)", 11, 0,
                 counter(stack, "kvroute_retries_total") - retries, max(worst, elapsed))


def _timed(call: Callable[[int], httpx.Response], n: int) -> tuple[list[httpx.Response], float]:
    out, worst = [], 0.0
    for i in range(n):
        t0 = time.monotonic()
        out.append(call(i))
        worst = max(worst, time.monotonic() - t0)
    return out, worst


def test_killed_router_replica_leaves_the_other_serving(stack: str) -> None:
    routers = {_ok(stack, f"probe {i}").headers["x-kvroute-router"] for i in range(20)}
    victim = sorted(routers)[0]
    kill_replica(ROUTER_DEPLOYMENT, victim)
    retries = counter(stack, "kvroute_retries_total")
    results, worst = _timed(lambda i: _ok(stack, f"after router kill {i}"), 20)
    failed = [r for r in results if r.status_code != 200]
    assert len(failed) <= 1, [r.text for r in failed]  # at most one request in flight there
    report_fault("router replica killed", 20, len(failed),
                 counter(stack, "kvroute_retries_total") - retries, worst)
    assert all(r.headers["x-kvroute-router"] != victim for r in results if r.status_code == 200)
