"""``server.ingress: direct`` on real Serve: two router replicas listen on one port themselves
(SO_REUSEPORT), one sim replica behind them.

Through that port: health, answers equal to those through Serve's proxy (which still serves
the app on its own port), the request id as the proxy gives it (the client's sane id
echoed and used as the body id; an unsafe one replaced), new connections spread over both
router replicas, and a client that leaves mid-stream leaves nothing running. Last, one
router replica SIGKILLed: the stream it held is cut, new connections reach the other one at
once, Serve starts a replacement listening on the same port, and nothing the dead router
started still runs on the worker.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from deploy.config import IndexConfig, KvrouteConfig, RouterConfig, ServerConfig
from tests.conftest import free_port
from tests.stacks import deployed, proxy_port, sim_model

pytestmark = pytest.mark.slow
MODEL = "direct-sim"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path) -> Iterator[tuple[str, str]]:
    proxied = f"http://127.0.0.1:{proxy_port()}"  # the session's proxy, wherever it is
    cfg = KvrouteConfig(
        models=[sim_model(MODEL, tiny_model_dir, tpot_s=0.005)], index=IndexConfig(),
        router=RouterConfig(replicas=2),
        server=ServerConfig(host="127.0.0.1", port=free_port(), ingress="direct"))
    with deployed(cfg) as url:
        assert url.endswith(f":{cfg.server.port}")
        yield url, proxied  # (direct, through the session's proxy)


def _body(stream: bool, max_tokens: int = 30) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Tell me about ports. " * 20}]}


def _streamed_text(r: httpx.Response) -> str:
    out = []
    for line in r.iter_lines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


def test_health_and_answers_as_through_the_proxy(stack: tuple[str, str]) -> None:
    direct, proxied = stack
    assert httpx.get(f"{direct}/health", timeout=5).status_code == 200
    answers = []
    for url in (direct, proxied):
        r = httpx.post(f"{url}/v1/chat/completions", json=_body(False), timeout=60)
        assert r.status_code == 200, r.text
        answers.append(r.json()["choices"][0]["message"]["content"])
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=_body(True),
                          timeout=60) as s:
            assert s.status_code == 200 and s.headers["x-kvroute-model"] == MODEL
            answers.append(_streamed_text(s))
    assert answers[0] and len(set(answers)) == 1, answers


def test_request_id_is_the_clients_or_a_new_one(stack: tuple[str, str]) -> None:
    direct, _ = stack
    r = httpx.post(f"{direct}/v1/chat/completions", json=_body(False),
                   headers={"x-request-id": "agent-42.turn-7"}, timeout=60)
    # the body's id is the request id with the API's prefix (OpenAI's chatcmpl-)
    assert r.headers["x-request-id"] == "agent-42.turn-7"
    assert r.json()["id"] == "chatcmpl-agent-42.turn-7"
    r = httpx.post(f"{direct}/v1/chat/completions", json=_body(False),
                   headers={"x-request-id": "a" * 300}, timeout=60)
    rid = r.headers["x-request-id"]
    assert r.json()["id"] == f"chatcmpl-{rid}" and len(rid) == 32, rid
    r = httpx.post(f"{direct}/v1/chat/completions", json={"model": MODEL}, timeout=60)
    assert r.status_code == 400 and r.headers["x-request-id"]  # errors carry one too


def test_connections_spread_over_the_router_replicas(stack: tuple[str, str]) -> None:
    direct, _ = stack
    routers = set()
    for _ in range(24):  # a new connection each: the kernel picks a listener per connection
        with httpx.Client() as c:
            r = c.post(f"{direct}/v1/chat/completions", json=_body(False, 1), timeout=60)
            routers.add(r.headers["x-kvroute-router"])
    assert len(routers) == 2, routers


def _loads(url: str) -> tuple[int, int]:
    reps = httpx.get(f"{url}/kvroute/replicas", timeout=5).json()["models"][MODEL]
    return (sum(int(r.get("ongoing_requests", 0)) for r in reps),
            sum(int(r.get("router_ongoing", 0)) for r in reps))


def test_a_client_that_leaves_mid_stream_leaves_nothing_running(
        stack: tuple[str, str]) -> None:
    direct, _ = stack
    with httpx.stream("POST", f"{direct}/v1/chat/completions", json=_body(True, 20000),
                      timeout=30) as r:
        assert r.status_code == 200
        for i, _line in enumerate(r.iter_lines()):
            if i == 4:
                break
    deadline = time.monotonic() + 10  # 20,000 tokens at 5 ms: only an abort ends it sooner
    while _loads(direct)[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _loads(direct)[0] == 0, "the worker still runs the abandoned stream"


# --- a router replica lost (runs last: it kills one of the module's two routers) ---------

def _listeners(port: int) -> set[int]:
    """The router replica processes listening on ``port`` (SO_REUSEPORT: one each)."""
    return {c.pid for c in psutil.net_connections("tcp") if c.pid and c.laddr
            and c.laddr.port == port and c.status == psutil.CONN_LISTEN}


def _server_of(port: int, client_port: int) -> int:
    """The process holding the server side of the connection from ``client_port``."""
    for c in psutil.net_connections("tcp"):
        if c.pid and c.laddr and c.laddr.port == port and c.raddr \
                and c.raddr.port == client_port:
            return int(c.pid)
    raise AssertionError(f"no server side for the connection from port {client_port}")


def _pooled(direct: str, n: int) -> list[tuple[httpx.Client, int]]:
    """``n`` clients, each with one idle keep-alive connection, and the router pid it is on."""
    out = []
    for _ in range(n):
        client = httpx.Client(timeout=30)
        with client.stream("POST", f"{direct}/v1/chat/completions",
                           json=_body(False, 1)) as r:
            r.read()
            local = r.extensions["network_stream"].get_extra_info("client_addr")[1]
        out.append((client, _server_of(int(direct.rsplit(":", 1)[1]), local)))
    return out


def test_a_killed_router_replica_fails_only_its_connections(stack: tuple[str, str]) -> None:
    direct, _ = stack
    port = int(direct.rsplit(":", 1)[1])
    assert len(_listeners(port)) == 2
    idle = _pooled(direct, 8)
    held = httpx.Client(timeout=30)
    with held.stream("POST", f"{direct}/v1/chat/completions", json=_body(True, 20000)) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        victim = _server_of(port, r.extensions["network_stream"]
                            .get_extra_info("client_addr")[1])
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(httpx.TransportError):  # the held stream is cut, not completed
            for _ in lines:
                pass
    cut_s = time.monotonic() - killed
    first = httpx.post(f"{direct}/v1/chat/completions", json=_body(False, 1), timeout=30)
    first_s = time.monotonic() - killed
    assert first.status_code == 200, first.text  # a new connection, at once, succeeds
    for _ in range(8):  # each a new connection: all reach the surviving router
        with httpx.Client() as c:
            r2 = c.post(f"{direct}/v1/chat/completions", json=_body(False, 1), timeout=30)
            assert r2.status_code == 200 and r2.headers["x-kvroute-router"] == \
                first.headers["x-kvroute-router"], r2.text
    # idle keep-alive connections to the dead replica: the kernel closed them (FIN), so
    # the client's pool drops them and its next request opens a new connection
    on_victim = [c for c, pid in idle if pid == victim]
    idle_ok = sum(c.post(f"{direct}/v1/chat/completions", json=_body(False, 1)
                         ).status_code == 200 for c in on_victim)
    for c, _ in idle:
        c.close()
    deadline = time.monotonic() + 120  # Serve notices the dead actor and starts a new one
    while len(_listeners(port) - {victim}) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    restored_s = time.monotonic() - killed
    assert len(_listeners(port) - {victim}) == 2, "Serve did not restart the router replica"
    print(f"\nROUTER LOSS (direct ingress): held stream cut after {cut_s:.3f} s; first new "
          f"request answered {first_s:.3f} s after the kill; idle keep-alive connections "
          f"on the dead replica: {len(on_victim)}, next request ok on {idle_ok}; a new "
          f"replica listens {restored_s:.1f} s after the kill")
    deadline = time.monotonic() + 15  # nothing the dead router started still runs
    while _loads(direct)[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _loads(direct)[0] == 0, "a worker still runs the dead router's stream"
