"""Processes the benchmarks start (peer routers, a plain echo app) and their CPU time.

Each server runs in its own process group and is stopped by its own pid (the machine is
shared: nothing else is touched). ``cpu_seconds`` sums user + system time over a set of
processes and their live descendants, plus what their reaped children used, with psutil.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil

Ready = Callable[[Any], bool]  # a test of a readiness URL's JSON body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port, stopped by its own pid."""
    import redis

    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


class Subprocess:
    """A server we start, in its own process group, stopped by its own pid."""

    def __init__(self, name: str, cmd: list[str], ready_url: str,
                 env: dict[str, str] | None = None, ready_timeout_s: float = 60.0,
                 ready_when: tuple[str, Ready] | None = None) -> None:
        """``ready_when``: (URL, test of its JSON body), checked once ``ready_url`` answers
        200: a router that serves before it has every worker is not ready yet."""
        self.name, self.cmd, self.ready_url = name, cmd, ready_url
        self.env, self.ready_timeout_s, self.ready_when = env, ready_timeout_s, ready_when
        self.log = Path(tempfile.mkstemp(prefix=f"kvroute-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return self.ready_url.rsplit("/v1/", 1)[0] if "/v1/" in self.ready_url \
            else self.ready_url.rstrip("/")

    def start(self) -> None:
        """Fork and exec (quick); readiness is awaited by ``__aenter__``."""
        env = {**os.environ, **self.env} if self.env else None
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)

    async def __aenter__(self) -> Subprocess:
        self.start()
        try:
            await self._wait_ready(self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        checks = [(self.ready_url, None), *([self.ready_when] if self.ready_when else [])]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            for url, test in checks:
                while not await self._answers(s, url, test):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.name} not ready ({url}): {self.tail()}")
                    await asyncio.sleep(0.25)

    async def _answers(self, s: aiohttp.ClientSession, url: str, test: Ready | None) -> bool:
        """Whether ``url`` answers 200 (and its JSON passes ``test``); raises if we exited."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.tail()}")
        try:
            async with s.get(url) as r:
                if r.status != 200:
                    return False
                return test is None or bool(test(await r.json(content_type=None)))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def processes(self) -> list[psutil.Process]:
        return [] if self.proc is None else [psutil.Process(self.proc.pid)]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)  # its own group: only what we started
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)


def cpu_by_process(roots: Iterable[psutil.Process]) -> dict[str, float]:
    """User + system CPU seconds of ``roots`` and their live descendants, each with the
    children it reaped, keyed ``"<pid> <program>"`` (processes that exited in between are
    lost: short-lived helpers)."""
    out: dict[str, float] = {}
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                t, cmd = p.cpu_times(), p.cmdline()
            except psutil.Error:
                continue
            name = _program(cmd) if cmd else p.name()
            out[f"{p.pid} {os.path.basename(name)}"] = (
                t.user + t.system + t.children_user + t.children_system)
    return out


def _program(cmd: list[str]) -> str:
    """The program of a command line; for a python, the script or ``-m`` module it runs."""
    prog = cmd[0].split(" ")[0]
    if os.path.basename(prog).startswith("python") and len(cmd) > 1:
        if cmd[1] == "-m" and len(cmd) > 2:
            return cmd[2]
        if not cmd[1].startswith("-"):  # a script; `-c CODE` and other flags: the python
            return cmd[1]
    return prog


def cpu_seconds(roots: Iterable[psutil.Process]) -> float:
    return sum(cpu_by_process(roots).values())


def descendants_matching(pred: Callable[[str], bool]) -> list[psutil.Process]:
    """This process's descendants whose command line satisfies ``pred`` (e.g. the Ray
    actors of a local cluster this process started; other users' clusters are not ours)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if pred(" ".join(p.cmdline())):
                found.append(p)
        except psutil.Error:
            continue
    return found
