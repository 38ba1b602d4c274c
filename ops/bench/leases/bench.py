"""KV leases, measured: the agent workload on sim replicas whose cache is smaller than the
sessions' working set, leases on and off, same seed.

    kvroute bench leases --duration 90 --concurrency 8 --kv-blocks 350
    kvroute bench leases --duration 90 --concurrency 24 --kv-blocks 580 \
        --tool-time-s 3 --user-time-s 30 --rounds 2

``--concurrency`` is the number of sessions alive at once (closed loop: a session that
ends is replaced by a new one). A session in a think time is idle, sending nothing, while
the others keep the replicas busy: ``--tool-time-s`` is the median pause after a turn that
called a tool (the tool runs), ``--user-time-s`` the median pause after a task's final
answer before the user's next task (log-normal, sigma 0.8; ``AgentParams``).

Each run deploys ``--replicas`` sim replicas (``kv_blocks`` each, ``lease_fraction``)
behind the kvroute router with a throwaway redis-server index and drives the agent
workload (``ops.bench.harness.workloads``: shared system prompt and tools, per-session histories,
tool pauses of ~1 s, user pauses of ~10 s) closed loop with Claude Code's identity headers,
so the router knows the sessions. The sim answers the workload's tool-call turns with a
tool call in the model's format (``workers/engines/sim/script.py``: the bench appends a marker
message to those requests only), and its final turns with plain text, so the router sees
how each turn ended (``router.leases.by_ending``). Runs alternate leases off, then on,
``--rounds`` times; printed per run: requests, TTFT p50 / mean / p99, cached-token ratio,
the lease renewals the router sent (final answers), and the working set against the cache:

    working set per replica = shared + sessions / replicas * (mean prompt - shared)

where ``shared`` is the system prompt and tools (the most cached tokens of a session's first
turn: a first turn can only hit that shared prefix, and under pressure its tail is often
evicted, so not the median) and ``mean prompt`` the mean prompt tokens of the main
sessions' turns (a session's history averaged over its turns). Sub-agents (short-lived
conversations of their own, ~40 % of the requests) come on top.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cache_service.hashing import DEFAULT_BLOCK_SIZE as BLOCK_SIZE
from ops.bench.harness.client import Client, LoadSpec, Record, Runner, agent_driver
from ops.bench.harness.config import StackSpec, build
from ops.bench.harness.report import bench_json
from ops.bench.harness.workloads import AgentParams, AgentWorkload, Call, Spawn, Step
from ops.bench.leases.prewarm import local_runs

MODEL = "lease-model"
MARKER = "KVROUTE-BENCH-CALL-A-TOOL"


def script(tool: str) -> dict[str, Any]:
    """The sim's replies: a tool call where the bench marked one, else its own tokens."""
    call = json.dumps({"name": tool, "arguments": {}})
    return {"segment_marker": "<|im_start|>user",
            "rules": [{"match": re.escape(MARKER), "reply": f"<tool_call>\n{call}\n</tool_call>"}]}


class MarkedWorkload(AgentWorkload):
    """The agent workload with a marker message after each call that the workload answers
    with a tool call (every call of a task but its last). Only that request carries it:
    the next turn's history does not, so the cached prefix is as without it."""

    def session(self, index: int) -> list[Step]:
        return [self._mark(s) for s in super().session(index)]

    def _mark(self, step: Step) -> Step:
        if not isinstance(step, Call):
            return Spawn(tuple(tuple(self._mark(s) for s in agent) for agent in step.agents))
        body = step.request.body
        if body["max_tokens"] == self.params.final_tokens:
            return step  # a task's last call: a final answer
        messages = [*body["messages"], {"role": "user", "content": MARKER}]
        req = type(step.request)(step.request.key, step.request.path,
                                 {**body, "messages": messages}, step.request.session)
        return Call(req, step.think_s)


def build_config(model_path: str, redis_url: str, port: int, *, leases: bool,
                 args: argparse.Namespace, script_path: str) -> Any:
    return build(StackSpec(
        model=MODEL, model_path=model_path, port=port, replicas=args.replicas,
        redis_url=redis_url, leases=leases, engine_kwargs={
            "kv_blocks": args.kv_blocks, "prefill_tok_s": args.prefill_tok_s,
            "tpot_s": args.tpot_s, "lease_fraction": args.lease_fraction,
            "script_path": script_path}))


async def _measure(url: str, workload: AgentWorkload, args: argparse.Namespace
                   ) -> tuple[list[Record], float, str]:
    spec = LoadSpec(duration_s=args.duration, concurrency=args.concurrency, ramp_s=5.0,
                    seed=args.seed)
    async with Client(url, MODEL, identity=True) as client:
        records = await Runner(client, spec, "leases", show=False).run(
            agent_driver(workload, spec))
    load = os.getloadavg()  # the machine is shared: each run says how busy it was
    await asyncio.sleep(1.2)  # /metrics is a snapshot up to ~1 s old
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics")).text
    renewals = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kvroute_lease_renewals_total{"))
    return records, renewals, f"{time.strftime('%H:%M', time.gmtime())} load {load[0]:.1f}"


def working_set(records: list[Record], args: argparse.Namespace) -> dict[str, float]:
    """The sessions' working set per replica over the device cache (module docstring)."""
    main = [r for r in records if r.ok and ".a" not in r.session]  # no sub-agent turns
    shared = float(max((r.cached_tokens for r in main if r.key.endswith(".t0")), default=0))
    prompt = float(np.mean([r.prompt_tokens for r in main])) if main else 0.0
    per_replica = shared + args.concurrency / args.replicas * max(0.0, prompt - shared)
    return {"shared_tokens": round(shared), "mean_prompt_tokens": round(prompt),
            "working_set_ratio": round(per_replica / (args.kv_blocks * BLOCK_SIZE), 2)}


def runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ops.models.tiny_model import ensure_model

    params = AgentParams(seed=args.seed, compact_tokens=args.compact_tokens,
                         tool_time_s=args.tool_time_s, user_time_s=args.user_time_s)
    workload = MarkedWorkload(params)
    tool = workload.tools[0]["function"]["name"]
    order = [on for _ in range(args.rounds) for on in (False, True)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.json"
        path.write_text(json.dumps(script(tool)))
        model = str(ensure_model())
        builds = [functools.partial(build_config, model, leases=on, args=args,
                                    script_path=str(path)) for on in order]
        out = []
        results = local_runs(builds, lambda url: asyncio.run(_measure(url, workload, args)))
        for on, (records, renewals, when) in zip(order, results, strict=True):
            bench = bench_json(records, workload="agent", policy="kvroute",
                               replicas=args.replicas, params=vars(args))
            row = {"leases": on, "ended": when, "requests": bench["requests"],
                   "errors": bench["errors"],
                   "ttft_p50_s": round(bench["ttft_s"]["p50"], 3),
                   "ttft_mean_s": round(bench["ttft_s"]["mean"], 3),
                   "ttft_p99_s": round(bench["ttft_s"]["p99"], 3),
                   "cached_ratio": round(bench["cached_token_ratio"], 4),
                   "renewals": int(renewals), **working_set(records, args)}
            print(row, flush=True)
            out.append(row)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=90.0, help="Load seconds per run.")
    p.add_argument("--rounds", type=int, default=1, help="Off/on pairs, alternated.")
    p.add_argument("--concurrency", type=int, default=8, help="Agent sessions at once.")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=350, help="Sim device blocks per replica.")
    p.add_argument("--lease-fraction", type=float, default=0.5)
    p.add_argument("--prefill-tok-s", type=float, default=20000.0)
    p.add_argument("--tpot-s", type=float, default=0.01)
    p.add_argument("--tool-time-s", type=float, default=AgentParams().tool_time_s,
                   help="Median pause after a tool-call turn (the tool runs).")
    p.add_argument("--user-time-s", type=float, default=AgentParams().user_time_s,
                   help="Median pause after a task's final answer (the user thinks).")
    p.add_argument("--compact-tokens", type=int, default=20000,
                   help="The workload compacts a session's history past this size.")


def run(args: argparse.Namespace) -> int:
    rows = runs(args)
    print("\nleases  requests  TTFT p50   mean    p99   cached  renewals  working set / cache"
          "  ended (UTC), load")
    for r in rows:
        print(f"{'on ' if r['leases'] else 'off'}     {r['requests']:>8}  {r['ttft_p50_s']:6.3f} "
              f"{r['ttft_mean_s']:6.3f} {r['ttft_p99_s']:6.3f}  {100 * r['cached_ratio']:5.1f}%"
              f"  {r['renewals']:>8}  {r['working_set_ratio']:.2f}  {r['ended']}")
    return 0
