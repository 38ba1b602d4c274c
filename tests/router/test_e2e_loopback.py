"""``router.stream_transport`` on real Serve with a sim replica: the loopback stream
(default) and the Serve stream give the same responses, streamed and not, and the
loopback one is really taken (the worker's ``loopback_streams`` in ``/kvroute/replicas``).

Cancel on disconnect, a replica killed mid-stream and retries run on the default
(loopback) in test_e2e_disconnects.py, test_faults.py and test_request_router.py;
the wire and its failure paths in test_loopback_stream.py and test_dispatch.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, RouterConfig
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "loop-sim"
SEEN: dict[str, dict[str, Any]] = {}  # transport -> what it answered


@pytest.fixture(scope="module", params=["serve", "loopback"])
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path,
          serve_port: int) -> Iterator[tuple[str, str]]:
    cfg = stack_config(serve_port, sim_model(MODEL, tiny_model_dir, tpot_s=0.002),
                       index=IndexConfig(), router=RouterConfig(stream_transport=request.param))
    with deployed(cfg) as url:
        yield request.param, url


def _chat(url: str, stream: bool) -> tuple[str, dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 40, "temperature": 0, "stream": stream,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me about routers. " * 20}]}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        return out["choices"][0]["message"]["content"], out["usage"]
    text, usage = [], {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                text.append(choice["delta"].get("content") or "")
    return "".join(text), usage


def _handoffs(url: str) -> int:
    reps = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"][MODEL]
    return sum(int(r.get("loopback_streams", 0)) for r in reps)


def test_both_transports_answer_alike(stack: tuple[str, str]) -> None:
    transport, url = stack
    streamed, s_usage = _chat(url, True)
    whole, w_usage = _chat(url, False)
    assert streamed == whole and streamed
    assert s_usage["completion_tokens"] == w_usage["completion_tokens"] == 40
    SEEN[transport] = {"text": whole, "usage": w_usage["completion_tokens"]}
    if len(SEEN) == 2:  # the second transport's run: the same answers as the first's
        assert SEEN["serve"] == SEEN["loopback"]
    deadline = time.monotonic() + 15  # the report reaches the router with the routing stats
    while (n := _handoffs(url)) == 0 and transport == "loopback" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert (n > 0) == (transport == "loopback"), n
