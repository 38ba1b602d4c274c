"""A client that leaves costs nothing, on every API and at every point.

Real Serve on loopback, one sim replica that prefills slowly (so "before the first token"
lasts over a second) and decodes 20,000 tokens at 10 ms each (so only an abort ends a
request early). For each API, the client disconnects before the first token, after one
event and after two: within 10 s the worker has no request left, and neither has this
router's own load view (``router_ongoing`` in ``/kvroute/replicas``). Before the fix, a
disconnect while waiting for the first token left the worker running and the router's
ticket open for good, and one after the first event or two leaked the same way
(the streams' first yields sat outside their ``try``).

Serve's per-request control headers change none of this:
``x-request-disconnect-disabled: ?1`` (the proxy then ignores the disconnect) and
``x-request-timeout-seconds: 0`` (the proxy's timeout lifted) meet the router's own
disconnect watch and deadline (``router/app/client_guard.py``). The stack's deadline is 15 s,
past every disconnect case's 10 s settle window, so it cannot hide a leak there; the
session's Serve proxy has the default 3600 s, so only the router's deadline can end the
timed-out requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "slow-prefill"
DEADLINE_S = 15.0
NO_DISCONNECT = {"x-request-disconnect-disabled": "?1"}
NO_TIMEOUT = {"x-request-timeout-seconds": "0"}
PROMPT = "word " * 2500  # ~2.5k tokens at 2,000 tok/s: over a second before the first token
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                      "max_tokens": 20000}),
    "completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 20000}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}],
                                  "max_tokens": 20000}),
    "responses": ("/v1/responses", {"input": PROMPT, "max_output_tokens": 20000}),
}


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.01, prefill_tok_s=2000.0)
    cfg = stack_config(serve_port, model, index=IndexConfig())
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(
        update={"request_timeout_s": DEADLINE_S})})
    with deployed(cfg) as url:
        yield url


def _loads(url: str) -> tuple[int, int]:
    """(worker-reported ongoing requests, this router's own count) over the replicas."""
    reps = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"][MODEL]
    return (sum(int(r.get("ongoing_requests", 0)) for r in reps),
            sum(int(r.get("router_ongoing", 0)) for r in reps))


def _settled(url: str, timeout_s: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while (loads := _loads(url)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    return loads


def _leave(url: str, path: str, body: dict[str, Any], events: int,
           headers: dict[str, str] | None = None, stream: bool = True) -> None:
    """Stream, and close the connection after ``events`` SSE events (0: before any)."""
    payload = {"model": MODEL, "stream": stream, **body}
    if events == 0:
        with pytest.raises(httpx.ReadTimeout):  # gone while the worker still prefills
            httpx.post(f"{url}{path}", json=payload, headers=headers,
                       timeout=httpx.Timeout(5, read=0.5))
        return
    with httpx.stream("POST", f"{url}{path}", json=payload, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen == events:
                break


@pytest.mark.parametrize("events", [0, 1, 2], ids=["before-first-token", "after-1", "after-2"])
@pytest.mark.parametrize("api", list(BODIES))
def test_a_client_that_leaves_leaves_nothing_running(stack: str, api: str, events: int) -> None:
    assert _settled(stack) == (0, 0)
    path, body = BODIES[api]
    _leave(stack, path, _unique(body, f"{api} {events}"), events)
    assert _settled(stack) == (0, 0), f"{api} after {events} events: {_loads(stack)}"


def _unique(body: dict[str, Any], case: str) -> dict[str, Any]:
    """The body with a unique prefix: no cache hit from an earlier case."""
    unique = f"case {case} {time.time_ns()}: "
    body = {k: (unique + v if isinstance(v, str) else v) for k, v in body.items()}
    if "messages" in body:
        body["messages"] = [{"role": "user", "content": unique + PROMPT}]
    return body


@pytest.mark.parametrize(("stream", "events"), [(False, 0), (True, 0), (True, 1)],
                         ids=["unstreamed", "before-first-token", "after-1"])
def test_disconnect_disabled_header_does_not_keep_work_running(
        stack: str, stream: bool, events: int) -> None:
    """The proxy ignores this client's disconnect; the router's own watch does not."""
    assert _settled(stack) == (0, 0)
    path, body = BODIES["chat"]
    _leave(stack, path, _unique(body, f"header {stream} {events}"), events,
           headers=NO_DISCONNECT, stream=stream)
    assert _settled(stack) == (0, 0), f"stream={stream} after {events}: {_loads(stack)}"


def _timed_out(url: str, headers: dict[str, str], stream: bool) -> str:
    """How a 200-second generation ended: its status, or how its stream stopped."""
    path, body = BODIES["chat"]
    payload = {"model": MODEL, "stream": stream, **_unique(body, f"deadline {headers}")}
    with httpx.stream("POST", f"{url}{path}", json=payload, headers=headers,
                      timeout=DEADLINE_S * 3) as r:
        if not stream:
            return str(r.status_code)
        try:
            done = any(line.startswith("data: [DONE]") for line in r.iter_lines())
        except httpx.RemoteProtocolError:
            return "cut"
        return "finished" if done else "ended"


def test_timeout_header_does_not_lift_the_routers_deadline(stack: str) -> None:
    """With or without ``x-request-timeout-seconds: 0``, a request outliving
    ``server.request_timeout_s`` ends: a 408, or its stream cut, and nothing runs on."""
    assert _settled(stack) == (0, 0)
    cases = [(h, s) for h in ({}, NO_TIMEOUT) for s in (False, True)]
    with ThreadPoolExecutor(len(cases)) as pool:
        ends = list(pool.map(lambda c: _timed_out(stack, *c), cases))
    assert ends == ["408", "cut", "408", "cut"], list(zip(cases, ends, strict=True))
    assert _settled(stack) == (0, 0), _loads(stack)
