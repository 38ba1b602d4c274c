"""Figures for bounded work before admission (``pytest -s``; nothing here asserts a
time): what one 8 MiB hostile body costs the router (seconds, RSS growth of the router
process), and the latency of 8 concurrent normal streams on the same router while 4
hostile bodies arrive.

Real stack: Ray Serve on loopback, one router replica, one sim replica (context 32768)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from tests.router.hostile import PeakRss, hostile_tools_body
from tests.stacks import deployed, listener_pid, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-hostile"
KEY = "sk-kvr-bench-test-key"
HEADERS = {"content-type": "application/json", "x-api-key": KEY}


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    auth = AuthConfig(api_keys_env="", api_keys=[ApiKeyConfig(name="b", key_sha256=hash_key(KEY))])
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.01, max_ongoing_requests=32)
    with deployed(stack_config(serve_port, model, auth=auth)) as url:
        yield url


def _hostile(url: str, body: bytes) -> tuple[int, float]:
    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/messages/count_tokens", content=body, headers=HEADERS,
                   timeout=600)
    return r.status_code, time.perf_counter() - started


class _Streams:
    """8 clients streaming chat completions in a loop; records e2e and inter-chunk gaps."""

    def __init__(self, url: str, n: int = 8) -> None:
        self.url, self.n = url, n
        self.e2e: list[float] = []
        self.gaps: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(n)

    def _one(self, client: httpx.Client, i: int) -> None:
        body = {"model": MODEL, "max_tokens": 32, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": f"client {i}: hello there"}]}
        started = last = time.perf_counter()
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                self.errors += 1
                return
            for line in r.iter_lines():
                if line.startswith("data:"):
                    now = time.perf_counter()
                    self.gaps.append(now - last)
                    last = now
        self.e2e.append(time.perf_counter() - started)

    def _loop(self, i: int) -> None:
        with httpx.Client(base_url=self.url, headers=HEADERS, timeout=600) as client:
            while not self._stop.is_set():
                self._one(client, i)

    def __enter__(self) -> _Streams:
        for i in range(self.n):
            self._pool.submit(self._loop, i)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)


def _p(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else float("nan")


def _report(label: str, s: _Streams) -> None:
    print(f"HOSTILE {label}: {len(s.e2e)} streams, {s.errors} errors; e2e p50 "
          f"{_p(s.e2e, 50):.3f} s p99 {_p(s.e2e, 99):.3f} s max {max(s.e2e):.3f} s; "
          f"inter-chunk p99 {_p(s.gaps, 99):.3f} s max {max(s.gaps):.3f} s")


def test_hostile_bodies_cost_and_stream_latency(stack: str) -> None:
    body = hostile_tools_body(MODEL, 8 << 20)
    _hostile(stack, json.dumps({"model": MODEL, "messages": [
        {"role": "user", "content": "warm"}]}).encode())
    with PeakRss(listener_pid(stack)) as rss:  # the router replica: direct ingress
        status, took = _hostile(stack, body)
    print(f"\nHOSTILE one {len(body) / (1 << 20):.1f} MiB body of tools to count_tokens: "
          f"{status} after {took:.2f} s, router RSS +{rss.growth_mib:.0f} MiB")
    with _Streams(stack) as quiet:
        time.sleep(4.0)
    _report("baseline (no hostile body)", quiet)
    with _Streams(stack) as loud, PeakRss(listener_pid(stack)) as rss:
        time.sleep(1.0)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: _hostile(stack, body), range(4)))
        time.sleep(1.0)
    print(f"HOSTILE 4 bodies: statuses {[s for s, _ in results]}, slowest "
          f"{max(t for _, t in results):.2f} s, router RSS +{rss.growth_mib:.0f} MiB")
    _report("8 streams while 4 hostile bodies arrive", loud)
    assert loud.e2e and quiet.e2e
