"""``kvroute bench router``: the router's own work per request, before vs after the prompt
cache, in one run.

    kvroute bench router --quick --out router.json          # ~3 min on 2 cores
    kvroute bench router --lengths 1000,4000,16000,64000,160000 --repeats 8 --turns 32 \\
        --cold 4 --out router.json                           # the full run

For each mode it starts a fresh local Ray and one router replica over one sim replica
(an engine EMULATOR, prefill fast enough to never be the bottleneck), with the mode's
environment inherited by every Serve process:

* ``before``: ``KVROUTE_PROMPT_CACHE=0 KVROUTE_TOKENIZE_OFFLOAD=0``: whole-prompt
  tokenization on the event loop (the code before the prompt cache);
* ``after``: the defaults (prompt cache on, tokenization in the pool).

Per prompt length it sends, one at a time, non-streamed chat requests with ``max_tokens`` 1:
(a) ``repeat``: the same prompt again; (b) ``grow``: a session whose prompt grows by ~1k
tokens a turn, ending at the length; (c) ``cold``: a new prompt each time (a salt at its
start). Router CPU per request = psutil CPU time of the router replica process across the
request; added latency = its latency minus that of the same prompt as token ids sent
straight to the replica's own endpoint. The stall figure: inter-chunk gaps (p99) of 8
concurrent short streams, unloaded and while one cold prompt of the largest length arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp
import numpy as np
import psutil

from ops.bench.compare.bench import (
    MODEL,
    CompareSpec,
    build_config,
    direct_headers,
    free_port,
    replica_endpoints,
)
from ops.bench.harness.client import Record
from ops.bench.harness.lineup import timed
from ops.bench.harness.report import bench_json, stats

MODES: dict[str, dict[str, str]] = {
    "before": {"KVROUTE_PROMPT_CACHE": "0", "KVROUTE_TOKENIZE_OFFLOAD": "0"},
    "after": {"KVROUTE_PROMPT_CACHE": "1", "KVROUTE_TOKENIZE_OFFLOAD": "1"},
}
SCENARIOS = ("repeat", "grow", "cold")
TURN_TOKENS = 1000


@dataclass(frozen=True, slots=True)
class RouterBenchSpec:
    lengths: tuple[int, ...] = (1000, 16000, 64000)
    repeats: int = 4  # (a) requests per length
    turns: int = 8  # (b) turns of the growing session
    cold: int = 2  # (c) requests per length
    streams: int = 8  # stall figure: concurrent short streams
    stall_window_s: float = 3.0
    modes: tuple[str, ...] = ("before", "after")
    sim: dict[str, float] = field(default_factory=lambda: {
        "prefill_tok_s": 1e7, "tpot_s": 0.02, "tpot_per_batch_s": 0.0, "kv_blocks": 16384})


@dataclass(slots=True)
class Sample:
    mode: str
    scenario: str
    length: int
    prompt_tokens: int
    cpu_s: float
    latency_s: float
    direct_s: float


class Prompts:
    """Chat prompts of a given token length, measured with the tiny model's tokenizer."""

    def __init__(self, model_path: str) -> None:
        from ops.bench.harness.workloads import _words
        from router.prompt.cache import PromptCacheConfig
        from router.prompt.tokenizer import ChatTokenizer

        self.tok = ChatTokenizer(model_path, PromptCacheConfig(enabled=False))
        self._words = _words()
        probe = self._text(0, 4000)
        self.chars_per_token = len(probe) / len(self.tok.encode_full(probe))

    def _text(self, seed: int, chars: int) -> str:
        rng = np.random.default_rng(seed)
        words = rng.choice(len(self._words), size=chars // 5 + 1)
        return " ".join(self._words[i] for i in words)[:chars]

    def turns(self, salt: str, length: int, n_turns: int) -> list[list[dict[str, Any]]]:
        """Conversations of a session that ends near ``length`` tokens, ~1k per turn."""
        base = max(length - (n_turns - 1) * TURN_TOKENS, 200)
        chat = [{"role": "system", "content": f"{salt} " + self._text(1, int(
            base * self.chars_per_token))}]
        out = []
        for t in range(n_turns):
            chat = [*chat, {"role": "user", "content": self._text(
                100 + t, int(TURN_TOKENS * 0.9 * self.chars_per_token))}]
            out.append(chat)
            chat = [*chat, {"role": "assistant", "content": self._text(200 + t, 200)}]
        return out

    def one(self, salt: str, length: int) -> list[dict[str, Any]]:
        return self.turns(salt, length, 1)[0]

    def ids(self, chat: list[dict[str, Any]]) -> list[int]:
        return self.tok.encode_full(self.tok.render(chat))


def router_process() -> psutil.Process:
    """The newest kvroute router replica process of the Ray this process started (its
    descendants: other local clusters' routers are not ours; a previous mode's router may
    still be exiting)."""
    return _newest("ServeReplica:kvroute:kvroute-router", "router replica")


def proxy_process() -> psutil.Process:
    """The newest Serve HTTP proxy of the Ray this process started (as ``router_process``).
    With ``server.ingress: direct`` it serves no request, but it runs."""
    return _newest("ProxyActor", "Serve proxy")


def worker_process(model: str) -> psutil.Process:
    """The newest worker replica of ``model`` (as ``router_process``)."""
    return _newest(f"ServeReplica:kvroute:{model}", f"{model} replica")


def _newest(marker: str, what: str) -> psutil.Process:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(marker in part for part in p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    if not found:
        raise RuntimeError(f"no {what} process found")
    return max(found, key=lambda p: p.create_time())


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


# -- one mode -----------------------------------------------------------------------------
async def _one(s: aiohttp.ClientSession, url: str, direct: str, proc: psutil.Process,
               chat: list[dict[str, Any]], ids: list[int]) -> tuple[float, float, float]:
    """(router CPU s, latency through kvroute s, latency straight to the replica s)."""
    before = _cpu(proc)
    latency = await timed(s, "POST", f"{url}/v1/chat/completions",
                          {"model": MODEL, "messages": chat, "max_tokens": 1})
    cpu = _cpu(proc) - before
    direct_s = await timed(s, "POST", f"{direct}/v1/completions",
                           {"model": MODEL, "prompt": ids, "max_tokens": 1})
    return cpu, latency, direct_s


async def _scenarios(mode: str, spec: RouterBenchSpec, prompts: Prompts, url: str,
                     direct: str, show: bool, headers: dict[str, str]) -> list[Sample]:
    proc = router_process()
    out: list[Sample] = []
    # the direct endpoint's token; kvroute without keys ignores it
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     headers=headers) as s:
        await _one(s, url, direct, proc, prompts.one("warm", 200), [100, 101])
        for length in spec.lengths:
            chats = {
                "repeat": [prompts.one(f"{mode}-r{length}", length)] * spec.repeats,
                "grow": prompts.turns(f"{mode}-g{length}", length, spec.turns),
                "cold": [prompts.one(f"{mode}-c{length}-{i}", length) for i in range(spec.cold)],
            }
            for scenario, seq in chats.items():
                for chat in seq:
                    ids = prompts.ids(chat)
                    cpu, lat, direct_s = await _one(s, url, direct, proc, chat, ids)
                    out.append(Sample(mode, scenario, length, len(ids), cpu, lat, direct_s))
                if show:
                    last = out[-1]
                    print(f"  {mode} {scenario:6} {length:>7}: cpu {1e3 * last.cpu_s:7.1f} ms"
                          f"  latency {1e3 * last.latency_s:7.1f} ms", flush=True)
    return out


async def _stream_gaps(s: aiohttp.ClientSession, url: str, i: int, stop: asyncio.Event,
                       gaps: list[float]) -> None:
    body = {"model": MODEL, "max_tokens": 40, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": f"stream {i}: hello"}]}
    while not stop.is_set():
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            last = time.perf_counter()
            async for line in r.content:
                if line.startswith(b"data:"):
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now


async def stall(spec: RouterBenchSpec, prompts: Prompts, url: str, mode: str
                ) -> dict[str, float]:
    """Inter-chunk p99 of short streams, unloaded vs while one cold long prompt arrives.

    The cold prompt is built and its ~600 KB body encoded before any stream starts: done
    in the window, on the loop that reads the streams, it paused them 33-43 ms itself
    (found with a loop-lag probe), and every stall figure before counted that."""
    out: dict[str, float] = {}
    cold = json.dumps({"model": MODEL, "max_tokens": 1, "messages": prompts.one(
        f"{mode}-stall", max(spec.lengths))}).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for phase in ("unloaded", "cold_long_prompt"):
            gaps: list[float] = []
            stop = asyncio.Event()
            tasks = [asyncio.create_task(_stream_gaps(s, url, i, stop, gaps))
                     for i in range(spec.streams)]
            await asyncio.sleep(1.0)
            gaps.clear()  # from here on
            if phase == "unloaded":
                await asyncio.sleep(spec.stall_window_s)
            else:
                await timed(s, "POST", f"{url}/v1/chat/completions", cold)
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*tasks)
            out[f"{phase}_p99_s"] = float(np.percentile(gaps, 99)) if gaps else 0.0
            out[f"{phase}_max_s"] = max(gaps, default=0.0)
    return out


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_stack(spec: RouterBenchSpec, ingress: str = "auto") -> CompareSpec:
    """One router replica over one sim replica. No peer router runs here, so the replica
    publishes no vLLM-format KV events: encoding them for a cold 156k-token prompt took
    ~30 ms of its loop (measured), which no kvroute deployment pays."""
    return CompareSpec(engine="sim", replicas=1, sim=dict(spec.sim), ingress=ingress,
                       context_window=max(262144, 2 * max(spec.lengths)), peer_kv_events=False)


def run_mode(mode: str, spec: RouterBenchSpec, prompts: Prompts, model_path: str,
             show: bool) -> tuple[list[Sample], dict[str, float]]:
    """A fresh Ray whose processes inherit the mode's environment; one router, one sim."""
    from ops.bench.harness.stack import stack

    cfg = build_config(bench_stack(spec), model_path, free_port())
    with _environment(MODES[mode]), stack(cfg) as url:
        direct = asyncio.run(replica_endpoints(url, 1))[0]
        headers = asyncio.run(direct_headers(url))
        samples = asyncio.run(_scenarios(mode, spec, prompts, url, direct, show, headers))
        gaps = asyncio.run(stall(spec, prompts, url, mode))
    return samples, gaps


# -- results ------------------------------------------------------------------------------
def rows(samples: list[Sample]) -> list[dict[str, Any]]:
    """One row per (scenario, length, mode): medians, and the growing session's last turn."""
    out = []
    keys = sorted({(s.scenario, s.length, s.mode) for s in samples},
                  key=lambda k: (SCENARIOS.index(k[0]), k[1], k[2] != "before"))
    for scenario, length, mode in keys:
        group = [s for s in samples if (s.scenario, s.length, s.mode) == (scenario, length, mode)]
        if scenario == "repeat":
            group = group[1:] or group  # the first request of a repeated prompt is cold
        added = [s.latency_s - s.direct_s for s in group]
        out.append({"scenario": scenario, "length": length, "mode": mode, "n": len(group),
                    "prompt_tokens": group[-1].prompt_tokens,
                    # psutil's CPU times tick at 10 ms: the mean over the group, not a median
                    "cpu_ms_mean": 1e3 * sum(s.cpu_s for s in group) / len(group),
                    "added_ms_p50": 1e3 * float(np.median(added)),
                    "added_ms_p99": 1e3 * float(np.percentile(added, 99)),
                    "latency_ms_p50": 1e3 * float(np.median([s.latency_s for s in group]))})
    return out


def mode_bench(mode: str, samples: list[Sample], spec: RouterBenchSpec) -> dict[str, Any]:
    """The bench JSON of one mode (every request as a record; non-streamed: TTFT = E2E)."""
    records, clock = [], 0.0
    for i, s in enumerate(x for x in samples if x.mode == mode):
        records.append(Record(key=f"{s.scenario}.{s.length}.{i}", session=s.scenario,
                              start_s=clock, ttft_s=s.latency_s, e2e_s=s.latency_s,
                              prompt_tokens=s.prompt_tokens, completion_tokens=1,
                              replica="sim-0"))
        clock += s.latency_s + s.direct_s
    params = {"mode": mode, "env": MODES[mode], "spec": asdict(spec)}
    return bench_json(records, workload="router", policy=f"kvroute-{mode}", replicas=1,
                      params=params)


def run(spec: RouterBenchSpec, model_path: str, show: bool = True) -> dict[str, Any]:
    from ops.bench.compare.bench import environment

    prompts = Prompts(model_path)
    samples: list[Sample] = []
    stalls: dict[str, dict[str, float]] = {}
    for mode in spec.modes:
        got, stalls[mode] = run_mode(mode, spec, prompts, model_path, show)
        samples.extend(got)
    table = rows(samples)
    return {"modes": {m: mode_bench(m, samples, spec) for m in spec.modes}, "table": table,
            "samples": [asdict(s) for s in samples],
            "stall": stalls, "cpu_s_per_request": {m: stats(
                [s.cpu_s for s in samples if s.mode == m], (50, 99)) for m in spec.modes},
            "env": environment()}


def quick(spec: RouterBenchSpec) -> RouterBenchSpec:
    return replace(spec, lengths=(1000, 16000, 160000), repeats=3, turns=6, cold=1,
                   stall_window_s=2.0)


def markdown(result: dict[str, Any]) -> str:
    lines = ["| scenario | prompt tokens (last) | mode | requests | router CPU ms/request | "
             "added latency ms p50 / p99 |", "|---|---:|---|---:|---:|---:|"]
    for r in result["table"]:
        lines.append(f"| {r['scenario']} | {r['prompt_tokens']:,} | {r['mode']} | {r['n']} | "
                     f"{r['cpu_ms_mean']:.1f} | "
                     f"{r['added_ms_p50']:.1f} / {r['added_ms_p99']:.1f} |")
    lines += ["", "| mode | stream gap p99 unloaded ms | p99 while a cold long prompt arrives ms |"
              " max ms |", "|---|---:|---:|---:|"]
    lines += [f"| {mode} | {stall_cells(g)} |" for mode, g in result["stall"].items()]
    return "\n".join(lines) + "\n"


def stall_cells(g: dict[str, float]) -> str:
    """A stall figure's cells, in ms: unloaded p99, p99 while a cold prompt arrives, max."""
    return (f"{1e3 * g['unloaded_p99_s']:.1f} | {1e3 * g['cold_long_prompt_p99_s']:.1f} | "
            f"{1e3 * g['cold_long_prompt_max_s']:.1f}")
