"""Traces and metrics against a real OTLP collector (rotel) and a real Serve stack.

One request with a given ``traceparent`` yields router and worker spans in that
trace, correctly parented; stopping the collector fails no request; ``/metrics``
counters move.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.app.metrics_hub import CACHE_S
from tests.conftest import free_port
from tests.stacks import counter, deployed, report_fault, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-traced"
ROTEL = Path(__import__("rotel").__file__).parent / "rotel-agent"
_SPAN = re.compile(r"Trace ID\s*: (\w+)\s+Parent ID\s*: (\w*)\s+ID\s*: (\w+)\s+Name\s*: (\S+)")


class Collector:
    def __init__(self, workdir: Path) -> None:
        self.port, self.log = free_port(), workdir / "rotel.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(ROTEL), "start", "--otlp-http-endpoint", f"127.0.0.1:{self.port}",
             "--otlp-grpc-endpoint", f"127.0.0.1:{free_port()}", "--debug-log", "traces",
             "--debug-log-verbosity", "detailed", "--exporter", "blackhole",
             "--pid-file", str(self.log.with_suffix(".pid"))],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.post(f"http://127.0.0.1:{self.port}/v1/traces", content=b"", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("collector did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def spans(self) -> list[tuple[str, str, str, str]]:
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace"))
        return _SPAN.findall(text)


@pytest.fixture(scope="module")
def traced(ray_local: None, tiny_model_dir: Path, serve_port: int,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    collector = Collector(tmp_path_factory.mktemp("otel"))
    collector.start()
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{collector.port}"
    os.environ["OTEL_SERVICE_NAME"] = "kvroute-test"
    try:
        with deployed(stack_config(serve_port, sim_model(MODEL, tiny_model_dir))) as url:
            yield {"url": url, "collector": collector}
    finally:
        for k in [k for k in os.environ if k.startswith("OTEL_")]:
            del os.environ[k]
        os.environ.update(saved)
        collector.stop()


def _chat(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    text = "trace me " + "a long shared prompt " * 60  # several full blocks, cacheable
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def test_one_trace_spans_router_and_worker(traced: dict[str, Any]) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = _chat(traced["url"], {"traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200
    # the router's root span ends last (after the reply) and may reach the collector in a
    # later export batch than the worker's spans: wait for both
    deadline, spans = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        spans = [s for s in traced["collector"].spans() if s[0] == trace_id]
        names = {s[3] for s in spans}
        if {"worker.generate", "prefill", "decode", "index.lookup"} <= names and \
                any(pid == parent for _, pid, _, _ in spans):
            break
        time.sleep(0.5)
    by_name = {name: (pid, sid) for _, pid, sid, name in spans}
    parent_of = {sid: pid for _, pid, sid, _ in spans}
    roots = [sid for _, pid, sid, _ in spans if pid == parent]
    assert len(roots) == 1, "one router root span continues the incoming traceparent"

    def ancestors(sid: str) -> set[str]:
        out = set()
        while sid in parent_of:
            sid = parent_of[sid]
            out.add(sid)
        return out

    for child in ("index.lookup", "route", "dispatch"):
        assert roots[0] in ancestors(by_name[child][1]), child
    assert by_name["worker.generate"][0] == by_name["dispatch"][1]
    assert by_name["prefill"][0] == by_name["worker.generate"][1]
    assert by_name["decode"][0] == by_name["worker.generate"][1]
    assert any(name.startswith("plugin.") for name in by_name)


def _timed_requests(url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        assert _chat(url).status_code == 200
        out.append(time.perf_counter() - t)
    return sorted(out)


def test_collector_down_fails_no_request(traced: dict[str, Any]) -> None:
    up = _timed_requests(traced["url"], 20)
    traced["collector"].stop()
    retries = counter(traced["url"], "kvroute_retries_total")
    try:
        down = _timed_requests(traced["url"], 20)  # each asserts a 200
    finally:
        traced["collector"].start()
    report_fault("collector down", len(down), 0,
                 counter(traced["url"], "kvroute_retries_total") - retries, max(down))
    print(f"p50 latency with collector {up[10] * 1e3:.1f} ms, without {down[10] * 1e3:.1f} ms")


def _counter(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_counters_move(traced: dict[str, Any]) -> None:
    url = traced["url"]
    time.sleep(CACHE_S + 0.1)  # /metrics is a snapshot up to CACHE_S old
    before = httpx.get(f"{url}/metrics").text
    for _ in range(3):
        assert _chat(url).status_code == 200
    time.sleep(CACHE_S + 0.1)
    after = httpx.get(f"{url}/metrics").text
    assert _counter(after, "kvroute_requests_total") == _counter(before,
                                                                 "kvroute_requests_total") + 3
    assert _counter(after, "kvroute_prompt_tokens_total") > _counter(
        before, "kvroute_prompt_tokens_total")
    assert "kvroute_ttft_seconds_bucket" in after
    assert "kvroute_cached_tokens_total" in after
    assert _counter(after, "kvroute_cached_tokens_total") > 0  # the same prompt, repeated
