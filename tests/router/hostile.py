"""Hostile request bodies and router-process figures for the bounded-work tests."""

from __future__ import annotations

import json
import threading
import time

import psutil

_TOOL = {"name": "", "description": "d" * 40,
         "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}


def hostile_tools_body(model: str, size: int) -> bytes:
    """An Anthropic-shaped body just under ``size`` bytes, nearly all of it tool
    definitions (the review's costliest shape: 76k tools in 8 MiB took 17 s, +1.8 GiB)."""
    head = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    one = len(json.dumps({**_TOOL, "name": "tool_0000000"})) + 2
    count = (size - 1024) // one
    tools = [{**_TOOL, "name": f"tool_{i:07d}"} for i in range(count)]
    return json.dumps({**head, "tools": tools}).encode()


def router_pid() -> int:
    """The pid of the (single) kvroute router replica on this machine."""
    for p in psutil.process_iter(["cmdline"]):
        if any("ServeReplica:kvroute:kvroute-router" in part for part in p.info["cmdline"] or []):
            return p.pid
    raise AssertionError("no router replica process found")


class PeakRss:
    """Samples a process's RSS every 20 ms in a thread; ``growth_mib`` = peak - start."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / (1 << 20)
