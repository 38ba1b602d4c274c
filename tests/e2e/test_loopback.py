"""``router.stream_transport`` and ``router.start_transport`` on real Serve with a sim
replica: the Serve stream, the loopback stream, and loopback calls (the default) give
the same responses, streamed and not, and each is really taken (the worker's
``loopback_streams`` and ``loopback_calls`` in ``/kvroute/replicas``).

Cancel on disconnect, a replica killed mid-stream and retries run on the default
(loopback) in test_disconnects.py, test_faults.py and test_request_router.py;
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


TRANSPORTS = {  # name -> (stream_transport, start_transport, stream_interval_ms)
    "serve": ("serve", "serve", 0), "loopback": ("loopback", "serve", 0),
    "call": ("loopback", "loopback", 0), "paced": ("loopback", "loopback", 20),
}
CHUNKS: dict[str, int] = {}  # transport -> content chunks of its streamed answer


@pytest.fixture(scope="module", params=list(TRANSPORTS))
def stack(request: pytest.FixtureRequest, ray_local: None, tiny_model_dir: Path,
          serve_port: int) -> Iterator[tuple[str, str]]:
    stream, start, interval = TRANSPORTS[request.param]
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.002, stream_interval_ms=interval)
    cfg = stack_config(serve_port, model,
                       index=IndexConfig(),
                       router=RouterConfig(stream_transport=stream, start_transport=start))
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
    CHUNKS[url] = sum(1 for t in text if t)
    return "".join(text), usage


def _counts(url: str) -> tuple[int, int]:
    """The replicas' (loopback streams, loopback calls)."""
    reps = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"][MODEL]
    return (sum(int(r.get("loopback_streams", 0)) for r in reps),
            sum(int(r.get("loopback_calls", 0)) for r in reps))


def test_all_transports_answer_alike(stack: tuple[str, str]) -> None:
    transport, url = stack
    answers = [_chat(url, True), _chat(url, False), _chat(url, True)]
    (streamed, s_usage), (whole, w_usage), (again, _) = answers
    assert streamed == whole == again and streamed
    assert s_usage["completion_tokens"] == w_usage["completion_tokens"] == 40
    SEEN[transport] = {"text": whole, "usage": w_usage["completion_tokens"]}
    assert all(seen == SEEN[transport] for seen in SEEN.values())  # as the others answered
    deadline = time.monotonic() + 15  # the report reaches the router with the routing stats
    if transport == "paced":  # 40 tokens 2 ms apart, one chunk per 20 ms at most
        assert CHUNKS[url] <= 10, CHUNKS[url]
    want = {"serve": (False, False), "loopback": (True, False), "call": (True, True),
            "paced": (True, True)}[transport]
    while (got := tuple(n > 0 for n in _counts(url))) != want and time.monotonic() < deadline:
        time.sleep(0.3)
    assert got == want, _counts(url)
