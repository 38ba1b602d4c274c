"""One key's slow bodies cannot take every request slot (``router.auth.bodies``).

The real ingress app (every route and middleware; the scripted core of the API tests
behind the real ``RouterCore.generate`` admission) on the real direct listener on
127.0.0.1, whose open-request bound is 8. Key ``bob`` opens 8 requests that announce a
body and send one byte of it; key ``alice`` is then served. Before the per-key bound,
bob's 8 requests held all 8 slots and alice got a 503 ``overloaded``.
(Serve's proxy in front: ``tests/e2e/test_slow_bodies.py``.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx

from router.app.listener import Listener
from router.auth.bodies import BodyWaits
from router.auth.keys import ApiKeyConfig, Authenticator, hash_key
from tests.router.auth.test_auth_routes import CHAT, LimitedCore, ingress_client

ALICE, BOB = "sk-kvr-alice-slow-body", "sk-kvr-bob-slow-body"
SLOTS, PER_KEY = 8, 4


def _core(model_dir: Path) -> LimitedCore:
    core = LimitedCore(model_dir)
    core.auth = Authenticator([ApiKeyConfig(name="alice", key_sha256=hash_key(ALICE)),
                               ApiKeyConfig(name="bob", key_sha256=hash_key(BOB))])
    core.body_waits = BodyWaits(PER_KEY)
    return core


async def _slow_body(host: str, port: int, path: str
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request of bob's that announces 100 bytes of body and sends one (the writer is
    kept: a writer collected closes its connection)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {BOB}\r\n"
                 "content-type: application/json\r\ncontent-length: 100\r\n\r\n{".encode())
    await writer.drain()
    return reader, writer


async def _attack(address: str) -> tuple[list[int], httpx.Response]:
    host, port = address.rsplit(":", 1)
    paths = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/tokenize"]
    conns = [await _slow_body(host, int(port), paths[i % 4]) for i in range(SLOTS)]
    await asyncio.sleep(0.5)  # every one of them is in (or refused by) the app now
    refused = []
    for reader, _ in conns:
        try:
            head = await asyncio.wait_for(reader.read(12), 0.2)
            refused.append(int(head[9:12]))
        except TimeoutError:
            pass  # still waiting for its body
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as client:
        alice = await client.post("/v1/chat/completions", content=json.dumps(CHAT),
                                  headers={"authorization": f"Bearer {ALICE}",
                                           "content-type": "application/json"})
    for _, writer in conns:
        writer.close()
    return refused, alice


def test_another_keys_request_is_served_while_one_key_trickles_bodies(
        tiny_model_dir: Path) -> None:
    core = _core(tiny_model_dir)
    for _client in ingress_client(core):  # installs the core behind the app's routes
        from router.app import ingress

        async def run() -> tuple[list[int], httpx.Response]:
            listener = Listener("127.0.0.1", 0, graceful_s=0.1, max_open=SLOTS)
            await listener.start(ingress.app, "kvroute")
            try:
                return await _attack(listener.address)
            finally:
                await listener.stop()

        refused, alice = asyncio.run(run())
    print(f"\nbob's slow bodies refused at once: {refused}; alice: {alice.status_code}")
    assert alice.status_code == 200, alice.text  # before: 503 overloaded
    assert refused == [429] * (SLOTS - PER_KEY), refused  # past bob's bound, not held
    assert not core.body_waits.waiting  # every slot given back once the clients left


def test_a_bound_of_0_is_no_bound() -> None:
    waits = BodyWaits(0)
    with contextlib.ExitStack() as stack:
        for _ in range(1000):
            stack.enter_context(waits.hold("key:bob"))
        assert waits.waiting == {"key:bob": 1000}
    assert not waits.waiting
