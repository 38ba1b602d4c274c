"""Two more ``kvroute bench router`` figures of the prompt cache:

``--move``: a session's turn on a router replica that never saw it (a restart, a
scale-out), with and without the shared Redis level of the prompt cache
(``router.prompt.store``). In process, with the router's own ``ChatTokenizer``: replica A
serves a session growing by ~1k tokens a turn up to ``--move-length`` tokens; then a fresh
replica B serves its next turn, as (1) the cache off (whole-prompt tokenization, the code
before the prompt cache), (2) local cache only (B's is empty), (3) local + Redis; and, for
reference, (4) A itself (it saw the session). Process CPU and wall time of B's
render + tokenize (what the router does per request that the cache changes); every
result is checked bit-identical against full tokenization.

    kvroute bench router --move --move-sessions 3 --out move.json     # ~1 min
    kvroute bench router --move --move-sessions 10 --out move.json    # longer

``--agent``: router CPU per request on the agent workload (ops/bench/harness/workloads.py) at
16-way concurrency, prompt cache off vs on, in one run: a fresh local Ray per mode (one
router replica, one sim replica), psutil CPU time of the router replica process over the
whole run (drain included) divided by the requests it completed.

    kvroute bench router --agent --agent-duration 60 --out agent.json  # ~4 min on 2 cores
    kvroute bench router --agent --agent-duration 300 --out agent.json # longer
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ops.bench.compare.bench import MODEL
from ops.bench.harness.client import Client, LoadSpec, Runner, agent_driver
from ops.bench.harness.micro import timing
from ops.bench.harness.procs import free_port
from ops.bench.harness.workloads import AgentParams, AgentWorkload, Call, Spawn, Step
from ops.bench.router.bench import (
    MODES,
    Prompts,
    _cpu,
    proxy_process,
    router_process,
    worker_process,
)
from ops.bench.router.tree_stack import StackStartError, tree_stack

MOVE_CASES = ("cache off", "local only", "local + Redis", "same replica")
STACK_ATTEMPTS = 5  # --agent: Ray's 30 s start-up wait runs out on a busy machine


# -- a session moves to a new router replica ----------------------------------------------
@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """``url``, or a throwaway ``redis-server`` on a free loopback port."""
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--move needs redis-server on PATH or --redis-url")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def _tokenizer(model_path: str, case: str, url: str, ns: str) -> Any:
    from router.prompt.cache import PromptCacheConfig
    from router.prompt.setup import TokenCache
    from router.prompt.store import TokenStore
    from router.prompt.tokenizer import ChatTokenizer

    if case == "cache off":
        return ChatTokenizer(model_path, PromptCacheConfig(enabled=False))
    store = TokenStore(url, ns, ttl_s=600, timeout_s=0.5) if case != "local only" else None
    return ChatTokenizer(model_path, TokenCache(PromptCacheConfig(), store))


def _timed(tok: Any, chat: list[dict[str, Any]]) -> dict[str, float]:
    with timing() as t:
        ids = tok.render_encode(chat)
    out = {"cpu_ms": 1e3 * t.cpu_s, "wall_ms": 1e3 * t.wall_s, "tokens": len(ids)}
    if ids != tok.encode_full(tok.render(chat)):
        raise AssertionError("not bit-identical to full tokenization")
    stats = tok.prompt_cache.stats()
    out["tokenized"] = stats["new_tokens"] if tok.prompt_cache.active else len(ids)
    out["from_redis"] = stats["remote_tokens"]
    return out


def move_session(model_path: str, prompts: Prompts, url: str, i: int, length: int,
                 turns: int) -> dict[str, dict[str, float]]:
    """Replica A serves ``turns - 1`` turns; each case serves the last turn."""
    chats = prompts.turns(f"move-{i}-{time.time_ns()}", length, turns)
    a = _tokenizer(model_path, "local + Redis", url, "bench")
    for chat in chats[:-1]:
        a.commit(a.render_encode(chat))  # admitted: the router writes it to Redis then
    a.prompt_cache.store.flush()
    out = {}
    for case in MOVE_CASES:
        tok = a if case == "same replica" else _tokenizer(model_path, case, url, "bench")
        before = dict(tok.prompt_cache.stats())
        got = _timed(tok, chats[-1])
        got["tokenized"] -= before["new_tokens"] if tok.prompt_cache.active else 0
        got["from_redis"] -= before["remote_tokens"]
        out[case] = got
    return out


def run_move(model_path: str, sessions: int = 3, length: int = 160000, turns: int = 8,
             redis_url: str | None = None, show: bool = True) -> dict[str, Any]:
    prompts = Prompts(model_path)
    runs = []
    with redis_server(redis_url) as url:
        for i in range(sessions):
            runs.append(move_session(model_path, prompts, url, i, length, turns))
            if show:
                print("  " + "  ".join(f"{c}: {r['cpu_ms']:.0f}/{r['wall_ms']:.0f} ms"
                                       for c, r in runs[-1].items()), flush=True)
    table = [{"case": c, "tokens": runs[-1][c]["tokens"],
              **{f"{k}_p50": statistics.median(r[c][k] for r in runs)
                 for k in ("cpu_ms", "wall_ms", "tokenized", "from_redis")}}
             for c in MOVE_CASES]
    return {"move": {"sessions": sessions, "length": length, "turns": turns,
                     "table": table, "runs": runs}}


def move_markdown(result: dict[str, Any]) -> str:
    lines = ["| last turn on | prompt tokens | tokenized | from Redis | CPU ms p50 | "
             "latency ms p50 |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["move"]["table"]:
        lines.append(f"| {r['case']} | {r['tokens']:,} | {r['tokenized_p50']:,.0f} | "
                     f"{r['from_redis_p50']:,.0f} | {r['cpu_ms_p50']:.1f} | "
                     f"{r['wall_ms_p50']:.1f} |")
    return "\n".join(lines) + "\n"


# -- the agent workload at 16-way concurrency ------------------------------------------
@dataclass(frozen=True, slots=True)
class AgentBenchSpec:
    duration_s: float = 60.0
    concurrency: int = 16
    modes: tuple[str, ...] = ("before", "after")
    max_tokens: int | None = None  # cap every reply (1: the prompt side alone)
    base: str | None = None  # "before" runs this tree's code (None: the cache switched off)
    rounds: int = 1  # the modes alternated this many times
    ingress: str = "auto"  # "after"'s server.ingress (the base tree may predate the key)
    paced_ms: float | None = None  # also run "paced": "after" with this stream_interval_ms
    # think times scaled down (more requests per run); everything else as bench compare
    agent: AgentParams = field(default_factory=lambda: AgentParams(
        tool_time_s=0.2, user_time_s=1.0))
    sim: dict[str, float] = field(default_factory=lambda: {
        "prefill_tok_s": 1e6, "tpot_s": 0.01, "tpot_per_batch_s": 0.0, "kv_blocks": 65536})


class _Capped(AgentWorkload):
    """The agent workload with every reply capped at ``max_tokens``."""

    def __init__(self, params: AgentParams, salt: str, max_tokens: int) -> None:
        super().__init__(params, salt=salt)
        self.max_tokens = max_tokens

    def session(self, index: int) -> list[Step]:
        return self._cap(super().session(index))

    def _cap(self, steps: list[Step] | tuple[Step, ...]) -> list[Step]:
        out: list[Step] = []
        for s in steps:
            if isinstance(s, Call):
                body = {**s.request.body, "max_tokens": self.max_tokens}
                out.append(replace(s, request=replace(s.request, body=body)))
            else:
                out.append(Spawn(tuple(tuple(self._cap(a)) for a in s.agents)))
        return out


async def _agent_load(url: str, spec: AgentBenchSpec, mode: str) -> list[Any]:
    load = LoadSpec(duration_s=spec.duration_s, concurrency=spec.concurrency, ramp_s=2.0)
    work = (AgentWorkload(spec.agent, salt=mode) if spec.max_tokens is None
            else _Capped(spec.agent, mode, spec.max_tokens))
    async with Client(url, MODEL) as client:
        return await Runner(client, load, f"agent-{mode}", show=False).run(
            agent_driver(work, load))


def agent_mode(mode: str, spec: AgentBenchSpec, model_path: str) -> dict[str, Any]:
    """One mode's stack in a child process (``tree_stack``): the code of ``spec.base`` for
    "before" when given (else this tree with the cache switched off), this tree for "after"."""
    here = Path(__file__).resolve().parents[3]  # the repository
    tree, env = (Path(spec.base), {}) if spec.base and mode == "before" else (here, {})
    if not spec.base:
        env = MODES["after" if mode == "paced" else mode]
    stack = {"engine": "sim", "replicas": 1, "sim": dict(spec.sim), "context_window": 262144,
             "model_path": model_path}
    if mode != "before" and spec.ingress != "auto":
        stack["ingress"] = spec.ingress
    if mode == "paced":  # "after" with stream pacing (the base tree predates the key)
        stack["stream_interval_ms"] = spec.paced_ms
    for attempt in range(STACK_ATTEMPTS):  # a busy machine's Ray can time out starting
        try:
            with tree_stack(tree, stack, env) as url:
                procs = router_process(), proxy_process(), worker_process(MODEL)
                start = [_cpu(p) for p in procs]
                records = asyncio.run(_agent_load(url, spec, mode))
                cpu, proxy_cpu, worker_cpu = (_cpu(p) - c for p, c in zip(procs, start,
                                                                          strict=True))
            break
        except StackStartError:
            if attempt == STACK_ATTEMPTS - 1:
                raise
            time.sleep(10)
    ok = [r for r in records if r.ok]
    ingress = "proxy" if mode == "before" else spec.ingress
    return {"mode": mode, "tree": str(tree), "ingress": ingress,
            "requests": len(ok), "errors": len(records) - len(ok),
            "router_cpu_s": cpu, "cpu_ms_per_request": 1e3 * cpu / max(1, len(ok)),
            # the router tier: what Serve's proxy does for "before" (HTTP, the client's
            # writes) the router replica does itself with server.ingress: direct
            "proxy_cpu_s": proxy_cpu,
            "tier_cpu_ms_per_request": 1e3 * (cpu + proxy_cpu) / max(1, len(ok)),
            # pacing moves work into the worker (a timer per held chunk): shown, not hidden
            "worker_cpu_s": worker_cpu,
            "worker_cpu_ms_per_request": 1e3 * worker_cpu / max(1, len(ok)),
            "prompt_tokens_mean": statistics.fmean(r.prompt_tokens for r in ok) if ok else 0,
            "output_tokens_mean": statistics.fmean(r.completion_tokens for r in ok) if ok else 0,
            "tokens_per_chunk": sum(r.completion_tokens for r in ok)
            / max(1, sum(r.content_chunks for r in ok)),
            "ttft_ms_p50": 1e3 * statistics.median(r.ttft_s for r in ok) if ok else 0}


def run_agent(spec: AgentBenchSpec, model_path: str, show: bool = True) -> dict[str, Any]:
    """``spec.rounds`` rounds of the modes, alternated; the ratio of the modes' totals."""
    out = []
    for i in range(spec.rounds):
        for mode in spec.modes:
            out.append({"round": i + 1, **agent_mode(mode, spec, model_path)})
            if show:
                print(f"  agent {mode}: {out[-1]}", flush=True)
    def per_request(keys: tuple[str, ...]) -> dict[str, float]:
        return {m: 1e3 * sum(r[k] for r in out if r["mode"] == m for k in keys)
                / max(1, sum(r["requests"] for r in out if r["mode"] == m))
                for m in spec.modes}

    def over_before(by: dict[str, float], mode: str) -> float | None:
        return by[mode] / by["before"] if by.get("before") and mode in by else None

    by = per_request(("router_cpu_s",))
    tier = per_request(("router_cpu_s", "proxy_cpu_s"))
    return {"agent": {"spec": asdict(spec), "modes": out, "cpu_ms_per_request": by,
                      "after_over_before": over_before(by, "after"),
                      "paced_over_before": over_before(by, "paced"),
                      "tier_cpu_ms_per_request": tier,
                      "tier_after_over_before": over_before(tier, "after"),
                      "tier_paced_over_before": over_before(tier, "paced")}}


def agent_markdown(result: dict[str, Any]) -> str:
    lines = ["| round | mode | requests (ok) | mean prompt tokens | mean output tokens | "
             "output tokens per chunk | router CPU ms/request | router + proxy CPU ms/request "
             "| worker CPU ms/request | TTFT ms p50 |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["agent"]["modes"]:
        tier, worker = r.get("tier_cpu_ms_per_request"), r.get("worker_cpu_ms_per_request")
        lines.append(f"| {r.get('round', 1)} | {r['mode']} | {r['requests']} | "
                     f"{r['prompt_tokens_mean']:,.0f} | {r.get('output_tokens_mean', 0):.0f} | "
                     f"{r.get('tokens_per_chunk', 0):.2f} | {r['cpu_ms_per_request']:.1f} | "
                     f"{'' if tier is None else f'{tier:.1f}'} | "
                     f"{'' if worker is None else f'{worker:.1f}'} | {r['ttft_ms_p50']:.0f} |")
    agent = result["agent"]
    paced = f"paced (stream_interval_ms {agent.get('spec', {}).get('paced_ms') or 0:g})"
    for mode, key, what in (("after", "after_over_before", "router"),
                            (paced, "paced_over_before", "router"),
                            ("after", "tier_after_over_before", "router + proxy"),
                            (paced, "tier_paced_over_before", "router + proxy")):
        if agent.get(key) is not None:
            lines.append(f"{mode} / before, {what} CPU per request: {agent[key]:.2f}x")
    if len(lines) > len(agent["modes"]) + 2:
        lines.insert(len(agent["modes"]) + 2, "")
    return "\n".join(lines) + "\n"


# -- command line (kvroute bench router --move / --agent) ----------------------------------
def add_arguments(r: Any) -> None:
    r.add_argument("--move", action="store_true", help="a session's turn on a router "
                   "replica that never saw it, with and without the Redis level (in process)")
    r.add_argument("--move-sessions", type=int, default=3, help="--move: sessions (median)")
    r.add_argument("--move-length", type=int, default=160000, help="--move: prompt tokens")
    r.add_argument("--move-turns", type=int, default=8, help="--move: turns before the move")
    r.add_argument("--redis-url", help="--move: this Redis (default: a throwaway redis-server)")
    r.add_argument("--agent", action="store_true", help="router CPU per request on the "
                   "agent workload, cache off vs on (live, one sim replica)")
    r.add_argument("--agent-duration", type=float, default=60.0, help="--agent: s per mode")
    r.add_argument("--agent-concurrency", type=int, default=16, help="--agent: sessions")
    r.add_argument("--agent-max-tokens", type=int, help="--agent: cap every reply (1: the "
                   "router's prompt-side work alone, no output streaming)")
    r.add_argument("--agent-base", help="--agent: \"before\" runs the code of this checkout "
                   "(e.g. a worktree of a commit before the prompt cache) instead of this "
                   "code with the prompt cache off")
    r.add_argument("--agent-rounds", type=int, default=1, help="--agent: alternate the modes "
                   "this many times (the ratio is over all rounds)")
    r.add_argument("--agent-ingress", choices=("auto", "proxy", "direct"), default="auto",
                   help="--agent: \"after\"'s server.ingress (\"before\" keeps Serve's proxy; "
                   "auto, the default, is direct here)")
    r.add_argument("--agent-paced-ms", type=float, help="--agent: also run \"paced\": "
                   "\"after\" with this model stream_interval_ms (workers.transport.stream_pacing; "
                   "\"after\" has the default, 20 ms; 0: a chunk per token)")
    r.add_argument("--stall", type=int, metavar="ROUNDS", help="the stall figure alone, "
                   "this many rounds per --stall-ingress, median ratio (stall_rounds)")
    r.add_argument("--stall-ingress", default="auto", help="--stall: server.ingress values, "
                   "comma-separated, alternated each round (e.g. proxy,direct)")
    r.add_argument("--stall-length", type=int, default=160000,
                   help="--stall: the cold prompt's tokens")
    r.add_argument("--specials", action="store_true", help="the cost of encoding client "
                   "special-token strings as text, fast and slow path (in process; "
                   "ops.bench.router.special_cost)")
    r.add_argument("--specials-length", type=int, default=160000,
                   help="--specials: prompt tokens")


def cli(args: Any, model_path: str) -> tuple[dict[str, Any], str]:
    """The ``--move``, ``--agent``, ``--stall`` and/or ``--specials`` results and their
    markdown."""
    result: dict[str, Any] = {}
    text = ""
    if args.move:
        result.update(run_move(model_path, args.move_sessions, args.move_length,
                               args.move_turns, args.redis_url, show=not args.quiet))
        text += move_markdown(result)
    if args.agent:
        spec = AgentBenchSpec(duration_s=args.agent_duration,
                              concurrency=args.agent_concurrency,
                              max_tokens=args.agent_max_tokens, base=args.agent_base,
                              rounds=args.agent_rounds, ingress=args.agent_ingress,
                              modes=tuple(m for m in args.modes.split(",") if m in MODES)
                              + (("paced",) if args.agent_paced_ms is not None else ()),
                              paced_ms=args.agent_paced_ms)
        result.update(run_agent(spec, model_path, show=not args.quiet))
        text += ("\n" if text else "") + agent_markdown(result)
    if args.stall:
        from ops.bench.router import stall_rounds

        got, md = stall_rounds.cli(args, model_path)
        result.update(got)
        text += ("\n" if text else "") + md
    if args.specials:
        from ops.bench.router.special_cost import run_specials, specials_markdown

        result.update(run_specials(model_path, args.specials_length))
        text += ("\n" if text else "") + specials_markdown(result)
    return result, text
