"""The soak's agent workload (``--workload agent``): the bench's agent sessions (long shared
prefixes, multi-turn, tool calls, sub-agents; ``ops.bench.harness.workloads``) closed loop,
each slot on one model, every call streamed, retried as the OpenAI and Anthropic SDKs do.

A call that fails on the wire (refused, reset, a stream cut before its end) or with a 408,
429 or 5xx is sent again after a short back-off, up to ``retries`` times (the SDKs'
``max_retries`` is 2). Each failed attempt is an error (``Stats``); a call is *answered* when
an attempt completes or the server answers with an error the client does not retry, and
*lost* when its last attempt got no answer at all. A fault may cost errors; it must lose
nothing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ops.bench.harness.client import Client, Record
from ops.bench.harness.workloads import AgentParams, AgentWorkload, Call, Step

from .workload import Stats

RETRY_STATUSES = ("HTTP 408", "HTTP 409", "HTTP 429", "HTTP 5")
BACKOFF_S = 0.5


@dataclass(slots=True)
class Outcomes:
    """Calls by final outcome (after retries), and calls still waiting for an answer."""

    answered: int = 0
    failed: int = 0  # answered with an error the client does not retry, or retries spent
    lost: int = 0  # the last attempt got no answer at all
    retried: int = 0
    in_flight: int = 0


def retryable(error: str) -> bool:
    """Whether an SDK would send the call again: any wire failure, or 408/409/429/5xx."""
    return not error.startswith("HTTP ") or error.startswith(RETRY_STATUSES)


def _kind(model: str) -> str:
    return f"agent-{model}"


async def call(client: Client, step: Call, stats: Stats, out: Outcomes, retries: int) -> None:
    out.in_flight += 1
    try:
        for attempt in range(retries + 1):
            rec: Record = await client.send(step.request, time.monotonic())
            stats.record(_kind(client.model), rec.e2e_s or 0.0, rec.ttft_s, rec.error)
            if rec.ok:
                out.answered += 1
                return
            error = str(rec.error)
            if not retryable(error) or attempt == retries:
                if error.startswith("HTTP "):
                    out.failed += 1
                else:
                    out.lost += 1
                return
            out.retried += 1
            await asyncio.sleep(BACKOFF_S * (attempt + 1))
    finally:
        out.in_flight -= 1


async def script(client: Client, steps: list[Step] | tuple[Step, ...], stats: Stats,
                 out: Outcomes, retries: int, stop: asyncio.Event) -> None:
    for step in steps:
        if stop.is_set():
            return
        if isinstance(step, Call):
            if step.think_s > 0:
                try:
                    await asyncio.wait_for(stop.wait(), step.think_s)
                    return
                except TimeoutError:
                    pass
            await call(client, step, stats, out, retries)
        else:
            await asyncio.gather(*(script(client, agent, stats, out, retries, stop)
                                   for agent in step.agents))


async def slot(client: Client, work: AgentWorkload, first: int, step: int, stats: Stats,
               out: Outcomes, retries: int, stop: asyncio.Event) -> None:
    """Sessions ``first``, ``first + step``, ... one after another until ``stop``."""
    index = first
    while not stop.is_set():
        await script(client, work.session(index), stats, out, retries, stop)
        index += step


def params_for(model_is_real: bool, seed: int) -> AgentParams:
    """The sim model takes the bench's agent sessions with a 32k window; a real engine on
    CPU the same shape, smaller (a 1k-token system prompt, shorter tool results)."""
    if not model_is_real:
        return AgentParams(seed=seed, compact_tokens=16000, tool_time_s=0.5, user_time_s=3.0)
    return AgentParams(seed=seed, system_tokens=1000, tools=4, repo_tokens=400,
                       tool_result_tokens=300, reply_tokens=24, final_tokens=48,
                       compact_tokens=4000, summary_tokens=300, tool_time_s=0.5,
                       user_time_s=3.0, subagent_prob=0.0)
