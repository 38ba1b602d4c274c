"""The async load generator of ``kvroute bench``: any OpenAI-compatible server.

Every request streams (``stream: true`` with ``stream_options.include_usage``) and is
timed on the client's monotonic clock:

* TTFT: from sending the request to the first SSE chunk carrying content (text,
  ``delta.content`` or ``delta.tool_calls``);
* TPOT: (last content chunk - first) / (completion tokens - 1), for >= 2 tokens;
* E2E: from sending to the end of the stream;
* tokens from the final ``usage`` (``prompt_tokens_details.cached_tokens`` for the
  cache hits), the replica and the router's prediction from kvroute's response
  headers when present (``x-kvroute-replica``, ``x-kvroute-predicted-cached-tokens``).

Load: ``--concurrency N`` is a closed loop (N sessions, or N trace requests, in
flight; a finished one is replaced by the next), ``--rate R`` an open loop (Poisson
arrivals of sessions, or of trace requests, seeded). A trace without either replays
at its own timestamps divided by ``--speedup``. No request is sent after
``--duration``; the ones in flight finish (up to ``drain_timeout_s``, then they are
cancelled and count as errors). Agent sessions run their scripts: calls in order,
after their think time, sub-agents concurrently.

Progress is a rich bar redrawn by the run's own asyncio task (no refresh thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ops.bench.harness.workloads import AgentWorkload, BenchRequest, Call, Step


@dataclass(slots=True)
class Record:
    key: str
    session: str
    start_s: float  # when it was sent, seconds from the run's start
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    content_chunks: int = 0  # streamed chunks with content (tokens / chunks: their size)
    predicted_cached_tokens: int = 0
    replica: str = ""
    router: str = ""  # the router replica that answered (x-kvroute-router)
    error: str | None = None
    end_s: float | None = None  # when it ended (answered, failed or cut), run clock

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None


@dataclass(frozen=True, slots=True)
class LoadSpec:
    duration_s: float
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, per second
    speedup: float = 1.0  # trace timestamps / speedup (neither concurrency nor rate)
    ramp_s: float = 10.0  # closed loop: slots start spread over this window
    seed: int = 0
    drain_timeout_s: float = 300.0


def identity_headers(session: str) -> dict[str, str]:
    """Claude Code's identity headers for a workload session key: a sub-agent's key is its
    parent's plus ``.a<turn>.<k>`` (``workloads._SessionBuilder``)."""
    if not session:
        return {}
    main, dot, agent = session.partition(".a")
    out = {"x-claude-code-session-id": main}
    if dot:
        out["x-claude-code-agent-id"] = "a" + agent
    return out


async def fetch_model(url: str) -> str:
    """The first model ``GET /v1/models`` lists."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/models") as r:
        r.raise_for_status()
        return str((await r.json())["data"][0]["id"])


async def fetch_context_window(url: str, model: str) -> int | None:
    """The model's context window as ``GET /v1/models`` reports it (vLLM and SGLang:
    ``max_model_len``), or None when the server does not say."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/models") as r:
        r.raise_for_status()
        for m in (await r.json()).get("data", []):
            window = m.get("max_model_len") or m.get("context_window")
            if m.get("id") == model and isinstance(window, int):
                return window
    return None


class Client:
    """Streams one request at a time per call of ``send``; share it across tasks."""

    def __init__(self, url: str, model: str, timeout_s: float = 900.0,
                 headers: dict[str, str] | None = None, identity: bool = False) -> None:
        self.url, self.model, self.timeout_s = url.rstrip("/"), model, timeout_s
        self.headers = headers  # sent with every request (a direct endpoint's token)
        self.identity = identity  # send agent identity headers, as Claude Code does
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=self.headers,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, req: BenchRequest, t0: float) -> Record:
        assert self._session is not None, "use Client as an async context manager"
        body = {**req.body, "model": self.model, "stream": True,
                "stream_options": {"include_usage": True}}
        start = time.monotonic()
        rec = Record(req.key, req.session, start - t0)
        try:
            return await self._stream(req, body, rec, start)
        finally:
            rec.end_s = time.monotonic() - t0

    async def _stream(self, req: BenchRequest, body: dict[str, Any], rec: Record,
                      start: float) -> Record:
        assert self._session is not None
        try:
            headers = identity_headers(req.session) if self.identity else None
            async with self._session.post(f"{self.url}{req.path}", json=body,
                                          headers=headers) as resp:
                rec.replica = resp.headers.get("x-kvroute-replica", "")
                rec.router = resp.headers.get("x-kvroute-router", "")
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return rec
                with contextlib.suppress(ValueError):
                    rec.predicted_cached_tokens = int(
                        resp.headers.get("x-kvroute-predicted-cached-tokens", "0"))
                last = await _read_stream(resp, rec, start)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: bad JSON
            rec.error = f"{type(e).__name__}: {e}"[:200]
            return rec
        rec.e2e_s = time.monotonic() - start
        if rec.error is None and rec.ttft_s is None:
            rec.error = "no content and no usage in the stream"
        if rec.ok and rec.completion_tokens > 1 and last is not None:
            rec.tpot_s = (last - start - rec.ttft_s) / (rec.completion_tokens - 1)  # type: ignore[operator]
        return rec


async def _read_stream(resp: aiohttp.ClientResponse, rec: Record, start: float) -> float | None:
    """Parse SSE; fills ``rec``; returns the time of the last content chunk."""
    last: float | None = None
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            rec.error = str(chunk["error"].get("message", chunk["error"]))[:200]
            break
        if usage := chunk.get("usage"):
            rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            rec.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            rec.cached_tokens = int(details.get("cached_tokens") or 0)
        choices = chunk.get("choices") or []
        if choices and _has_content(choices[0]):
            rec.content_chunks += 1
            last = time.monotonic()
            if rec.ttft_s is None:
                rec.ttft_s = last - start
        elif choices and choices[0].get("finish_reason") and rec.ttft_s is None:
            rec.ttft_s = time.monotonic() - start  # finished without any content
    return last


def _has_content(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls"))


class Runner:
    """One run: the clock, the deadline, the records and the progress bar."""

    def __init__(self, client: Client, spec: LoadSpec, label: str, show: bool = True) -> None:
        self.client, self.spec, self.label = client, spec, label
        self.records: list[Record] = []
        self._open: dict[int, Record] = {}  # sent and unanswered
        self.t0 = time.monotonic()
        self._show = show
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def inflight(self) -> int:
        return len(self._open)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    @property
    def expired(self) -> bool:
        return self.elapsed >= self.spec.duration_s

    async def sleep(self, seconds: float) -> None:
        """Sleep, but no further than the deadline."""
        await asyncio.sleep(max(0.0, min(seconds, self.spec.duration_s - self.elapsed)))

    async def call(self, req: BenchRequest) -> Record | None:
        if self.expired:
            return None
        sent = Record(req.key, req.session, self.elapsed)  # what the drain records if cut
        self._open[id(sent)] = sent
        try:
            rec = await self.client.send(req, self.t0)
        finally:
            del self._open[id(sent)]
        self.records.append(rec)
        return rec

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:  # never silent
            self.records.append(Record("?", "", self.elapsed, error=f"client: {exc!r}"[:200]))

    async def run(self, driver: Callable[[Runner], Awaitable[None]]) -> list[Record]:
        """Run ``driver``, then drain the spawned work; returns the records."""
        self.t0 = time.monotonic()
        with self._progress() as progress:
            ticker = asyncio.ensure_future(self._tick(progress))
            try:
                await driver(self)
                await self._drain()
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                self._update(progress)
        return sorted(self.records, key=lambda r: r.start_s)

    async def _drain(self) -> None:
        deadline = self.t0 + self.spec.duration_s + self.spec.drain_timeout_s
        while self._tasks:
            left = deadline - time.monotonic()
            if left <= 0:
                cut = list(self._open.values())  # each with its own key and send time
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                for rec in cut:
                    rec.error = (f"drain timeout: no answer {self.elapsed - rec.start_s:.0f} s "
                                 "after it was sent")
                self.records.extend(cut)
                return
            await asyncio.wait(list(self._tasks), timeout=left)

    @contextlib.contextmanager
    def _progress(self) -> Iterator[Progress | None]:
        if not self._show:
            yield None
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"), console=Console(stderr=True),
            auto_refresh=False,
        )
        progress.add_task(self.label, total=self.spec.duration_s, stats="")
        with progress:
            yield progress

    async def _tick(self, progress: Progress | None) -> None:
        while True:
            self._update(progress)
            await asyncio.sleep(0.5)

    def _update(self, progress: Progress | None) -> None:
        if progress is None:
            return
        done = [r for r in self.records if r.ok]
        errors = len(self.records) - len(done)
        ttft = float(np.median([r.ttft_s for r in done[-200:]])) if done else 0.0
        hit = sum(r.cached_tokens for r in done) / (sum(r.prompt_tokens for r in done) or 1)
        stats = (f"req {len(done)}  err {errors}  in-flight {self.inflight}  "
                 f"ttft p50 {ttft:.3f}s  cached {100 * hit:.1f}%")
        progress.update(progress.task_ids[0], completed=min(self.elapsed, self.spec.duration_s),
                        stats=stats)
        progress.refresh()


# -- drivers -----------------------------------------------------------------------------
async def run_script(runner: Runner, steps: tuple[Step, ...] | list[Step]) -> None:
    """One agent (or sub-agent): its calls in order, after their think times."""
    for step in steps:
        if runner.expired:
            return
        if isinstance(step, Call):
            if step.think_s > 0:
                await runner.sleep(step.think_s)
            await runner.call(step.request)
        else:
            await asyncio.gather(*(run_script(runner, agent) for agent in step.agents))


def agent_driver(workload: AgentWorkload, spec: LoadSpec) -> Callable[[Runner], Awaitable[None]]:
    """Sessions: closed loop (N slots, next session when one ends) or Poisson arrivals."""
    counter = iter(range(1 << 30))

    async def slot(runner: Runner, delay: float) -> None:
        await runner.sleep(delay)
        while not runner.expired:
            await run_script(runner, workload.session(next(counter)))

    async def drive(runner: Runner) -> None:
        if spec.concurrency:
            n = spec.concurrency
            for i in range(n):
                runner.spawn(slot(runner, spec.ramp_s * i / n))
            return
        rate = spec.rate or 1.0
        rng = np.random.default_rng([spec.seed, 0x5E55])
        while True:
            await runner.sleep(float(rng.exponential(1.0 / rate)))
            if runner.expired:
                return
            runner.spawn(run_script(runner, workload.session(next(counter))))

    return drive


def trace_driver(items: list[tuple[float, BenchRequest]],
                 spec: LoadSpec) -> Callable[[Runner], Awaitable[None]]:
    """Trace requests: at their timestamps / speedup, or closed loop, or Poisson."""

    async def closed(runner: Runner, it: Iterator[tuple[float, BenchRequest]]) -> None:
        for _, req in it:
            if await runner.call(req) is None:
                return

    async def drive(runner: Runner) -> None:
        if spec.concurrency:
            it = iter(items)
            for _ in range(spec.concurrency):
                runner.spawn(closed(runner, it))
            return
        rng = np.random.default_rng([spec.seed, 0x7ACE])
        t = 0.0
        for arrival, req in items:
            t = t + float(rng.exponential(1.0 / spec.rate)) if spec.rate else arrival / spec.speedup
            await runner.sleep(t - runner.elapsed)
            if runner.expired:
                return
            runner.spawn(runner.call(req))

    return drive
