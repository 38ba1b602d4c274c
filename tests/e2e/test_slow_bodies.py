"""One key's slow bodies behind Serve's proxy (``server.ingress: proxy``): the router
replica takes 8 requests (``router.max_ongoing_requests``), Serve queues 1 more; key
``bob`` opens 16 requests that announce a body and send one byte, then key ``alice``
asks. Before the per-key bound (``server.max_body_waits_per_key``, here 4) bob's requests
held every slot of the router replica and alice waited (timed out at 10 s; the review: to
her 30 s client timeout); now bob's 5th and later are a fast 429 and alice is served
(200 in 0.12 s). ``pytest -s`` prints both and what bob's requests got.
(The direct listener: ``tests/router/app/test_slow_bodies.py``.)"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import RouterConfig, ServerConfig
from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-slow-bodies"
ALICE, BOB = "sk-kvr-alice-e2e-slow", "sk-kvr-bob-e2e-slow"
BOB_REQUESTS = 16
PER_KEY = int(os.environ.get("KVROUTE_TEST_BODY_WAITS", "4"))  # 0: the code before


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    auth = AuthConfig(api_keys_env="", api_keys=[
        ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE)),
        ApiKeyConfig(name="bob", key_sha256=hash_key(BOB))])
    server = ServerConfig(host="127.0.0.1", port=serve_port, ingress="proxy",
                          body_read_timeout_s=30.0, max_body_waits_per_key=PER_KEY)
    cfg = stack_config(serve_port, sim_model(MODEL, tiny_model_dir), auth=auth,
                       router=RouterConfig(max_ongoing_requests=8, max_queued_requests=1))
    with deployed(cfg.model_copy(update={"server": server})) as url:
        yield url


def test_another_key_is_served_behind_the_proxy_while_one_trickles_bodies(stack: str) -> None:
    url = httpx.URL(stack)
    socks = []
    for _ in range(BOB_REQUESTS):
        s = socket.create_connection((url.host, url.port), timeout=5)
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                  f"{BOB}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{"
                  .encode())
        socks.append(s)
    time.sleep(2.0)  # the proxy has handed them to the router replica (or refused them)
    try:
        started = time.monotonic()
        try:
            r = httpx.post(f"{stack}/v1/chat/completions", timeout=10, json={
                "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {ALICE}"})
            status = r.status_code
        except httpx.TimeoutException:
            status = 0
        print(f"\nalice behind the proxy: {status or 'timed out'} in "
              f"{time.monotonic() - started:.2f} s")
        assert status == 200  # before: timed out (the router replica's 8 slots were bob's)
    finally:
        print("bob's requests answered before alice asked:", _answered(socks))
        for s in socks:
            s.close()


def _answered(socks: list[socket.socket]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in socks:
        s.setblocking(False)
        try:
            head = s.recv(12)
        except BlockingIOError:
            head = b"waiting"
        key = head[9:12].decode() if head.startswith(b"HTTP/") else head.decode() or "closed"
        out[key] = out.get(key, 0) + 1
    return out
