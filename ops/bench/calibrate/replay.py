"""The replays ``kvroute bench calibrate`` runs on the real engine and on the fitted
emulator, and the per-request error between them.

* ``agent``: a fixed number of short agent sessions (``AgentWorkload`` with small sizes, so
  a CPU engine serves them in about a minute), ``concurrency`` sessions at a time;
* ``trace``: the first requests of a Mooncake trace, shrunk: each 512-token block becomes
  ``block_tokens`` token ids (the generator of ``ops.bench.harness.workloads``), so the
  trace's prefix sharing stays exact at a size a CPU engine prefills; replies capped at
  ``max_output`` tokens; ``concurrency`` requests in flight.

Both are finite (every request is sent, none is cut by a deadline) and keyed, so the real
and emulated runs are matched request by request. The error of a request is
``|TTFT_sim - TTFT_real| / TTFT_real``; the hit-rate difference is the emulator's cached
token ratio minus the real engine's, over the matched requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ops.bench.harness.client import Client, LoadSpec, Record, Runner, run_script
from ops.bench.harness.workloads import (
    COMPLETIONS_PATH,
    AgentParams,
    AgentWorkload,
    BenchRequest,
    block_token_ids,
)
from ops.sim.trace import load_trace

VOCAB = 4096
SMALL_AGENT = AgentParams(system_tokens=200, tools=2, subagent_system_tokens=80,
                          subagent_tools=1, repo_tokens=120, tool_result_tokens=60,
                          reply_tokens=8, final_tokens=12, tool_time_s=0.2, user_time_s=0.5,
                          turns_mean=3.0, tasks_mean=1.0, subagent_prob=0.1,
                          subagent_turns_mean=2.0, context_tokens=8192, summary_tokens=200)


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    trace: str | None = None  # a Mooncake JSONL; None: no trace replay
    trace_requests: int = 20
    block_tokens: int = 16  # a trace block's tokens here (512 in the trace)
    max_blocks: int = 24  # leave out longer trace requests
    max_output: int = 8
    agent_sessions: int = 4
    agent: AgentParams = field(default_factory=lambda: SMALL_AGENT)
    concurrency: int = 2
    timeout_s: float = 1800.0


def trace_slice(spec: ReplaySpec, salt: str) -> list[BenchRequest]:
    if spec.trace is None:
        return []
    out: list[BenchRequest] = []
    for r in load_trace(Path(spec.trace)):
        if len(out) >= spec.trace_requests:
            break
        if len(r.hash_ids) > spec.max_blocks:
            continue
        n = max(1, round(r.input_length * spec.block_tokens / 512))
        prompt = [t for h in r.hash_ids for t in block_token_ids(h, VOCAB, salt)
                  [: spec.block_tokens]][:n]
        body = {"prompt": prompt, "max_tokens": max(1, min(spec.max_output, r.output_length)),
                "temperature": 0}
        out.append(BenchRequest(f"trace.{len(out)}", COMPLETIONS_PATH, body))
    return out


def _finite(items: Iterator[Any], concurrency: int,
            one: Callable[[Runner, Any], Awaitable[Any]]) -> Callable[[Runner], Awaitable[None]]:
    async def slot(runner: Runner) -> None:
        for item in items:
            await one(runner, item)

    async def drive(runner: Runner) -> None:
        for _ in range(concurrency):
            runner.spawn(slot(runner))

    return drive


async def replay(url: str, model: str, spec: ReplaySpec, salt: str
                 ) -> dict[str, list[Record]]:
    """Both replays, one after the other: their records by workload."""
    load = LoadSpec(duration_s=spec.timeout_s, concurrency=spec.concurrency, ramp_s=0.0)
    out: dict[str, list[Record]] = {}
    workload = AgentWorkload(spec.agent, salt=salt)
    sessions = iter(workload.session(i) for i in range(spec.agent_sessions))
    async with Client(url, model) as client:
        out["agent"] = await Runner(client, load, "agent", show=False).run(
            _finite(sessions, spec.concurrency, run_script))
        if spec.trace is not None:
            reqs = iter(trace_slice(spec, salt))
            out["trace"] = await Runner(client, load, "trace", show=False).run(
                _finite(reqs, spec.concurrency, Runner.call))
    return out


def error(real: list[Record], sim: list[Record]) -> dict[str, Any]:
    """Per-request TTFT error and the hit-rate difference over the matched requests."""
    sims = {r.key: r for r in sim if r.ok}
    pairs = [(r, sims[r.key]) for r in real if r.ok and r.key in sims]
    rel = [abs(s.ttft_s - r.ttft_s) / r.ttft_s for r, s in pairs  # type: ignore[operator]
           if r.ttft_s]
    signed = [(s.ttft_s - r.ttft_s) / r.ttft_s for r, s in pairs  # type: ignore[operator]
              if r.ttft_s]
    prompt = sum(r.prompt_tokens for r, _ in pairs) or 1

    def ratio(side: int) -> float:
        return sum(p[side].cached_tokens for p in pairs) / prompt

    return {
        "requests": len(pairs), "real_errors": sum(not r.ok for r in real),
        "sim_errors": sum(not r.ok for r in sim),
        "ttft_rel_median": float(np.median(rel)) if rel else 0.0,
        "ttft_rel_p90": float(np.percentile(rel, 90)) if rel else 0.0,
        "ttft_bias_median": float(np.median(signed)) if signed else 0.0,
        "real_ttft_p50_s": float(np.median([r.ttft_s for r, _ in pairs])) if pairs else 0.0,
        "sim_ttft_p50_s": float(np.median([s.ttft_s for _, s in pairs])) if pairs else 0.0,
        "real_hit_rate": ratio(0), "sim_hit_rate": ratio(1),
        "hit_rate_diff": ratio(1) - ratio(0),
    }


def combined(errors: dict[str, dict[str, Any]], real: dict[str, list[Record]],
             sim: dict[str, list[Record]]) -> dict[str, Any]:
    """The error over both replays' requests together (what the JSON's ``error`` says)."""
    allr = [r for recs in real.values() for r in recs]
    alls = [r for recs in sim.values() for r in recs]
    return {**error(allr, alls), "by_workload": errors}


def params(spec: ReplaySpec) -> dict[str, Any]:
    return {**{k: v for k, v in asdict(spec).items() if k != "agent"},
            "agent": spec.agent.to_dict()}

