"""Per router of ``kvroute bench compare``: its processes, CPU per request, idle latency.

* Router CPU (``cpu_s_per_request``): user + system CPU seconds of every process of that
  router over its run (from after it is ready to the end of the drain), divided by the
  requests completed. kvroute: Serve's HTTP proxy and the router (ingress) replicas, the
  processes a request crosses before a worker (not Serve's controller, which does not
  serve requests). A peer: its process tree (``ops.bench.harness.procs.Subprocess``). psutil's
  clock ticks at 10 ms; over hundreds of requests that is negligible.
* Idle added latency (``added_latency_s``): a minimal chat request (one short user
  message, ``max_tokens`` 1, not streamed) through the router minus the same request
  straight to a replica's own endpoint, interleaved on the idle system: p50 - p50 and
  p99 - p99. A chat request because two peers (smg, sglang-router) refuse token-id prompts.
* Replica CPU (``replica_cpu_s_per_request``): the same over the worker replicas. A router
  that tokenizes through its workers (vllm-router calls ``/v1/chat/completions/render`` on
  every worker before each request) moves that work there, out of its own figure.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import psutil

from ops.bench.harness.procs import cpu_by_process, descendants_matching
from ops.bench.harness.report import stats

_KVROUTE_PROCS = ("ServeReplica:kvroute:kvroute-router", "ProxyActor")
WARMUP = 10


def worker_processes(model: str) -> list[psutil.Process]:
    """The worker replicas of ``model`` (engine and direct endpoint: where vllm-router's
    render calls and every router's requests are served)."""
    return descendants_matching(lambda cmd: f"ServeReplica:kvroute:{model}" in cmd)


def kvroute_processes() -> list[psutil.Process]:
    """Serve's proxy and kvroute's router replicas of the Ray this process started."""
    return descendants_matching(lambda cmd: any(k in cmd for k in _KVROUTE_PROCS))


class CpuMeter:
    """CPU seconds of a fixed set of processes between ``start()`` and ``stop()``."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        self._start: dict[str, float] = {}
        self.per_process: dict[str, float] = {}

    def start(self) -> None:
        self._start = cpu_by_process(self.procs)

    def stop(self) -> float:
        end = cpu_by_process(self.procs)
        self.per_process = {k: v - self._start.get(k, 0.0) for k, v in end.items()}
        return self.seconds

    @property
    def seconds(self) -> float:
        return sum(self.per_process.values())

    def summary(self, requests: int) -> dict[str, Any]:
        return {"cpu_s": self.seconds, "cpu_s_per_request": self.seconds / max(1, requests),
                "cpu_s_by_process": {k: round(v, 3) for k, v in self.per_process.items()}}


def minimal_chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def timed(s: aiohttp.ClientSession, method: str, url: str,
                body: dict[str, Any] | bytes | None) -> float:
    """Seconds from sending a request to its whole body read; a non-200 raises. ``body``
    as bytes is sent as encoded JSON (encoded ahead, off the measured loop)."""
    start = time.perf_counter()
    raw = isinstance(body, bytes)
    async with s.request(method, url, json=None if raw else body, data=body if raw else None,
                         headers={"content-type": "application/json"} if raw else None) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.text())[:300]}")
    return time.perf_counter() - start


async def idle_added_latency(target: str, direct: str, model: str, samples: int,
                             headers: dict[str, str] | None = None) -> dict[str, float]:
    """p50/p99 of (router - direct) for the minimal chat request, interleaved."""
    body = minimal_chat(model)
    via: list[float] = []
    own: list[float] = []
    async with aiohttp.ClientSession(headers=headers) as s:  # the direct endpoint's token
        for i in range(samples + WARMUP):
            a = await timed(s, "POST", f"{target}/v1/chat/completions", body)
            b = await timed(s, "POST", f"{direct}/v1/chat/completions", body)
            if i >= WARMUP:
                via.append(a)
                own.append(b)
    r, d = stats(via, (50, 99)), stats(own, (50, 99))
    return {"p50": r["p50"] - d["p50"], "p99": r["p99"] - d["p99"],
            "router_p50": r["p50"], "direct_p50": d["p50"], "samples": float(samples)}
