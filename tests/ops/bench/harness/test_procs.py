"""``Subprocess`` readiness: a server that answers before it has all its workers (as
sglang-router and smg do, each worker being a registration job of its own) is not ready
until its ``ready_when`` test passes."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest

from ops.bench.compare.peers import healthy_workers
from ops.bench.harness.procs import Subprocess, free_port

# /v1/models answers at once; /workers lists one healthy worker until it has been asked
# 4 times, then two; /hits says how often it was asked.
SERVER = """
import http.server, json, sys
hits = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        body = {}
        if self.path == "/workers":
            hits += 1
            body = {"workers": [{"is_healthy": True}] * (1 if hits < 5 else 2)}
        elif self.path == "/hits":
            body = {"hits": hits}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_healthy_workers_counts_only_healthy_ones() -> None:
    test = healthy_workers(2)
    assert not test({"workers": [{"is_healthy": True}, {"is_healthy": False}]})
    assert test({"workers": [{"is_healthy": True}, {"is_healthy": True}], "total": 2})
    assert not test({}) and not test([]) and not test({"workers": ["x", None]})


@pytest.mark.parametrize("n", [1, 2])
def test_ready_waits_for_the_workers(n: int) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = Subprocess("fake-router", [sys.executable, "-c", SERVER, str(port)],
                      f"{base}/v1/models", ready_timeout_s=30,
                      ready_when=(f"{base}/workers", healthy_workers(n)))

    async def hits_at_ready() -> int:
        async with proc, httpx.AsyncClient() as client:
            return int((await client.get(f"{base}/hits")).json()["hits"])

    # ready at the first answer that lists n healthy workers: the 1st, or the 5th
    assert asyncio.run(hits_at_ready()) == (1 if n == 1 else 5)
    assert proc.proc is not None and proc.proc.poll() is not None  # stopped on exit
