"""Bench workloads: Mooncake trace replay and seeded agentic coding sessions.

Both are pure functions of their inputs (trace file or seed, and a salt), so every
router in ``kvroute bench compare`` sees exactly the same requests.

**Trace** (``trace_requests``). Each ``hash_id`` becomes 512 token ids drawn by a
generator seeded with ``(salt, hash_id)``, in ``[MIN_TOKEN_ID, vocab - TOP_RESERVED)``
(clear of the special tokens that vocabularies keep at either end). A prompt is its
blocks' ids concatenated, the last block cut to the trace's ``input_length``; so two
requests that share leading hash ids share exactly those leading tokens. Requests go
to ``/v1/completions`` with a token-id prompt and ``max_tokens = output_length``.

**Agent** (``AgentWorkload``). Agentic coding sessions on ``/v1/chat/completions``:

* one system prompt and tool definitions shared by every session (~3k + ~3k tokens);
* per session, a repository context and a task, then tool-use turns: the assistant
  writes a little and calls a tool; the tool's result (file reads, grep and test
  output: log-normal sizes) is appended; the history grows turn after turn;
* think-time gaps: the tool's run time between turns, the user's between tasks;
* sub-agents: a turn may spawn 1-3 sub-agents that run in parallel, each its own
  conversation under a shared sub-agent system prompt and tool subset, whose
  summaries come back to the parent as tool results;
* compaction: when the next request (history + tools + reply, estimated at
  ``chars_per_token``, 2.5 by default: the old chars / 4 without the tools undercounted
  the demo tokenizer about 1.7x) would pass the server's ``context_tokens`` (tools
  included), or the history alone ``compact_tokens``, the session asks for
  a summary and restarts its history from it, as coding agents do; the summary request
  and tool results are cut to fit the window, so no request is refused with 413.

The assistant turns in the history are the script's, not the server's output, so the
requests do not depend on the server; ``max_tokens`` is the scripted reply's length.
Sizes are in approximate tokens (about 4 characters each); the server's tokenizer
decides the real counts, which the bench reads back from ``usage``.

A non-empty ``salt`` is written at the very start of every prompt (trace: it seeds
the token ids), so that runs with different salts share no cached prefix.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ops.sim.trace import TraceRequest, load_trace

TRACE_BLOCK = 512
MIN_TOKEN_ID, TOP_RESERVED = 100, 300
CHARS_PER_TOKEN = 4
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
# Room kept after a compaction check: the longest reply (600) and a task's end
# (final reply + next task) that are appended before the next check.
_HEADROOM = 1200
_CORPUS = Path(__file__).resolve().parents[2] / "models" / "tiny_corpus.txt"


@dataclass(frozen=True, slots=True)
class BenchRequest:
    key: str  # stable id: "trace.17", "s3.t5", "s3.a1.t2"
    path: str  # CHAT_PATH or COMPLETIONS_PATH
    body: dict[str, Any]  # the OpenAI body without model / stream
    session: str = ""


# -- trace replay ------------------------------------------------------------------------
@functools.lru_cache(maxsize=65536)
def block_token_ids(hash_id: int, vocab_size: int, salt: str = "") -> tuple[int, ...]:
    """The 512 token ids of one trace block: a pure function of (salt, hash_id, vocab)."""
    hi = vocab_size - TOP_RESERVED
    if hi <= MIN_TOKEN_ID:
        raise ValueError(f"vocab_size {vocab_size} is too small")
    rng = np.random.default_rng(xxhash.xxh64_intdigest(f"{salt}\x00{hash_id}".encode()))
    return tuple(int(t) for t in rng.integers(MIN_TOKEN_ID, hi, TRACE_BLOCK))


def trace_prompt(req: TraceRequest, vocab_size: int, salt: str = "") -> list[int]:
    ids: list[int] = []
    for h in req.hash_ids:
        ids.extend(block_token_ids(h, vocab_size, salt))
    return ids[: max(1, req.input_length)]


def trace_requests(
    path: str | Path, vocab_size: int, salt: str = "", max_requests: int | None = None,
    max_context: int | None = None,
) -> list[tuple[float, BenchRequest]]:
    """(arrival seconds from the first request, request), in arrival order; requests whose
    input + output exceed ``max_context`` (the server's context window) are left out."""
    reqs = load_trace(path, max_requests)
    if max_context is not None:
        reqs = [r for r in reqs if r.input_length + r.output_length <= max_context]
    t0 = reqs[0].arrival_s if reqs else 0.0
    out = []
    for i, r in enumerate(reqs):
        body = {"prompt": trace_prompt(r, vocab_size, salt), "max_tokens": max(1, r.output_length)}
        out.append((r.arrival_s - t0, BenchRequest(f"trace.{i}", COMPLETIONS_PATH, body)))
    return out


# -- agentic sessions --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AgentParams:
    """Every constant of the agent workload (token sizes are medians unless noted)."""

    seed: int = 0
    system_tokens: int = 3000  # shared system prompt
    tools: int = 16  # shared tool definitions (with ~150-token descriptions)
    subagent_system_tokens: int = 1200  # shared by all sub-agents
    subagent_tools: int = 6  # the first N tools
    repo_tokens: int = 1500  # per-session repository context
    tasks_mean: float = 2.0  # user tasks per session (1 + Poisson, at most 4)
    turns_mean: float = 8.0  # assistant calls per task (geometric, 2..25)
    tool_result_tokens: int = 1500  # log-normal, sigma 1.0, capped at 12k
    reply_tokens: int = 80  # assistant reply with a tool call (= max_tokens), sigma 0.6
    final_tokens: int = 250  # the reply that ends a task
    tool_time_s: float = 1.0  # gap before the next call: the tool's run time (sigma 0.8)
    user_time_s: float = 10.0  # gap before the next task (sigma 0.8)
    subagent_prob: float = 0.1  # chance that a turn spawns sub-agents
    subagent_turns_mean: float = 5.0
    compact_tokens: int = 40000  # history size that triggers a compaction
    context_tokens: int = 0  # the server's context window (0: unknown); the bench fills it
    chars_per_token: float = 2.5  # estimate of the server tokenizer (the demo: 2.8-4.5)
    summary_tokens: int = 2000

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def override_params(base: AgentParams, seed: int, items: list[str]) -> AgentParams:
    """``base`` with ``seed`` and ``KEY=VALUE`` overrides (``--agent`` options)."""
    types = {f.name: f.type for f in fields(base)}
    upd: dict[str, Any] = {"seed": seed}
    for item in items:
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"--agent {key}: unknown; known: {sorted(types)}")
        upd[key] = float(value) if types[key] == "float" else int(value)
    return replace(base, **upd)


def with_context(params: AgentParams, window: int | None) -> AgentParams:
    """``params`` with the server's context window, unless one was given already."""
    if window is None or params.context_tokens:
        return params
    return replace(params, context_tokens=window)



@dataclass(frozen=True, slots=True)
class Call:
    request: BenchRequest
    think_s: float  # wait this long after the previous step before sending


@dataclass(frozen=True, slots=True)
class Spawn:
    agents: tuple[tuple[Call | Spawn, ...], ...]  # sub-agent scripts, run concurrently


Step = Call | Spawn


@functools.lru_cache(maxsize=1)
def _words() -> tuple[str, ...]:
    return tuple(sorted(set(re.findall(r"[a-z]+", _CORPUS.read_text().lower()))))


class _Text:
    """Deterministic filler text from a seeded generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.words = rng, _words()

    def _pick(self, n: int) -> list[str]:
        return [self.words[i] for i in self.rng.integers(0, len(self.words), n)]

    def prose(self, tokens: int) -> str:
        words = self._pick(max(1, tokens * CHARS_PER_TOKEN // 6))
        out, line = [], []
        for i, w in enumerate(words):
            line.append(w.capitalize() if i % 12 == 0 else w)
            if i % 12 == 11:
                out.append(" ".join(line) + ".")
                line = []
        out.append(" ".join(line))
        return "\n".join(" ".join(out[i:i + 6]) for i in range(0, len(out), 6)).strip()

    def code(self, tokens: int) -> str:
        lines = max(1, tokens * CHARS_PER_TOKEN // 36)
        w = self._pick(lines * 4)
        indents = self.rng.integers(0, 3, lines)
        return "\n".join(
            f"{'    ' * int(indents[i])}{w[4 * i]}_{w[4 * i + 1]} = "
            f"{w[4 * i + 2]}({w[4 * i + 3]}, {i})" for i in range(lines)
        )

    def name(self) -> str:
        return "_".join(self._pick(2))

    def lognormal(self, median: float, sigma: float, lo: float, hi: float) -> float:
        return float(np.clip(median * np.exp(sigma * self.rng.standard_normal()), lo, hi))


_TOOL_NAMES = ("Read", "Edit", "Bash", "Grep", "Glob", "Write", "Task", "TodoWrite",
               "WebFetch", "WebSearch", "NotebookEdit", "LS", "MultiEdit", "ExitPlanMode",
               "BashOutput", "KillShell")


def _tools(text: _Text, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        name = _TOOL_NAMES[i] if i < len(_TOOL_NAMES) else f"Tool{i}"
        props = {text.name(): {"type": "string", "description": text.prose(12)}
                 for _ in range(3)}
        out.append({"type": "function", "function": {
            "name": name, "description": text.prose(150),
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
        }})
    return out


def _tokens(messages: list[dict[str, Any]], chars_per_token: float = CHARS_PER_TOKEN,
            tools: list[dict[str, Any]] | None = None) -> int:
    """Estimated prompt tokens: message text (+40 chars of framing each) and tools."""
    chars = sum(len(m.get("content") or "") + 40 for m in messages)
    chars += sum(len(json.dumps(m["tool_calls"])) for m in messages if m.get("tool_calls"))
    chars += len(json.dumps(tools)) if tools else 0
    return int(chars / chars_per_token)


def prompt_limit(p: AgentParams) -> int:
    """The largest request (prompt with tools + max_tokens) a session plans: the server's
    window less 5% + 256 tokens; without one, ``compact_tokens`` plus the tools' share."""
    if not p.context_tokens:
        return p.compact_tokens + 8000
    return int(p.context_tokens * 0.95) - 256


class AgentWorkload:
    """Agentic coding sessions; ``session(i)`` is a pure function of (params, salt, i)."""

    def __init__(self, params: AgentParams | None = None, salt: str = "") -> None:
        self.params, self.salt = params or AgentParams(), salt
        p = self.params
        text = _Text(np.random.default_rng([p.seed, 0xA6E7]))
        lead = f"[{salt}] " if salt else ""
        self.system = lead + "You are a coding agent.\n" + text.prose(p.system_tokens)
        self.tools = _tools(text, p.tools)
        self.sub_system = lead + "You are a sub-agent.\n" + text.prose(p.subagent_system_tokens)
        self.sub_tools = self.tools[: p.subagent_tools]

    def session(self, index: int) -> list[Step]:
        text = _Text(np.random.default_rng([self.params.seed, 1, index]))
        return _SessionBuilder(self, text, f"s{index}").main()


class _SessionBuilder:
    """Writes one session's script (see the module docstring)."""

    def __init__(self, w: AgentWorkload, text: _Text, key: str) -> None:
        self.w, self.p, self.t, self.key = w, w.params, text, key
        self.calls = 0
        self.steps: list[Step] = []

    def main(self) -> list[Step]:
        p, t = self.p, self.t
        system = {"role": "system", "content": self.w.system}
        repo = f"Repository notes:\n{t.prose(int(t.lognormal(p.repo_tokens, 0.5, 200, 8000)))}"
        messages = [system, {"role": "user", "content": f"{repo}\n\nTask: {t.prose(60)}"}]
        tasks = min(4, 1 + int(t.rng.poisson(max(0.0, p.tasks_mean - 1))))
        think = 0.0
        for task in range(tasks):
            if task:
                messages.append({"role": "user", "content": f"Next task: {t.prose(60)}"})
                think = t.lognormal(p.user_time_s, 0.8, 0.5, 120)
            turns = int(np.clip(t.rng.geometric(1.0 / max(1.0, p.turns_mean)), 2, 25))
            messages = self._task(messages, system, turns, think, self.w.tools, True)
        return self.steps

    def _task(self, messages: list[dict[str, Any]], system: dict[str, Any], turns: int,
              think: float, tools: list[dict[str, Any]], main: bool) -> list[dict[str, Any]]:
        p, t = self.p, self.t
        for turn in range(turns):
            if turn == turns - 1:
                self._call(messages, tools, p.final_tokens, think)
                messages.append({"role": "assistant", "content": t.prose(p.final_tokens)})
                return messages
            reply = int(t.lognormal(p.reply_tokens, 0.6, 16, 600))
            self._call(messages, tools, reply, think)
            if main and t.rng.random() < p.subagent_prob:
                think = self._spawn(messages, reply)
            else:
                think = self._tool_turn(messages, tools, reply)
            if (self._est(messages, []) > p.compact_tokens
                    or self._est(messages, tools) + _HEADROOM > prompt_limit(p)):
                messages = self._compact(messages, system, tools)
                think = 0.2
        return messages

    def _est(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return _tokens(messages, self.p.chars_per_token, tools)

    def _call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              max_tokens: int, think: float) -> None:
        body = {"messages": list(messages), "tools": tools, "max_tokens": max_tokens}
        req = BenchRequest(f"{self.key}.t{self.calls}", CHAT_PATH, body, self.key)
        self.steps.append(Call(req, think))
        self.calls += 1

    def _tool_turn(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   reply: int) -> float:
        t = self.t
        tool = tools[int(t.rng.integers(0, len(tools)))]["function"]
        cid = f"call_{self.key}_{self.calls}"
        args = {k: t.name() for k in tool["parameters"]["properties"]}
        messages.append({"role": "assistant", "content": t.prose(max(8, reply - 30)),
                         "tool_calls": [{"id": cid, "type": "function", "function": {
                             "name": tool["name"], "arguments": json.dumps(args)}}]})
        size = int(t.lognormal(self.p.tool_result_tokens, 1.0, 20, 12000))
        result = t.code(size) if t.rng.random() < 0.6 else t.prose(size)
        # Agents cut long tool output; a quarter of the window leaves room to compact.
        result = result[: int(prompt_limit(self.p) / 4 * self.p.chars_per_token)]
        messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        return t.lognormal(self.p.tool_time_s, 0.8, 0.05, 30)

    def _spawn(self, messages: list[dict[str, Any]], reply: int) -> float:
        p, t = self.p, self.t
        n = int(t.rng.integers(1, 4))
        agents, calls = [], []
        for k in range(n):
            cid = f"call_{self.key}_{self.calls}_{k}"
            task = t.prose(120)
            calls.append({"id": cid, "type": "function", "function": {
                "name": "Task", "arguments": json.dumps({"prompt": task})}})
            sub = _SessionBuilder(self.w, t, f"{self.key}.a{self.calls}.{k}")
            sub_msgs = [{"role": "system", "content": self.w.sub_system},
                        {"role": "user", "content": task}]
            turns = int(np.clip(t.rng.geometric(1.0 / max(1.0, p.subagent_turns_mean)), 2, 15))
            sub._task(sub_msgs, sub_msgs[0], turns, 0.0, self.w.sub_tools, False)
            agents.append(tuple(sub.steps))
        self.steps.append(Spawn(tuple(agents)))
        messages.append({"role": "assistant", "content": t.prose(max(8, reply - 30)),
                         "tool_calls": calls})
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": t.prose(int(t.lognormal(400, 0.5, 50, 2000)))})
        return 0.2

    def _compact(self, messages: list[dict[str, Any]], system: dict[str, Any],
                 tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ask = {"role": "user", "content": "Summarize the conversation so far for a handoff."}
        keep = messages[1:]
        # The summary request drops the oldest turns that would not fit (whole tool rounds).
        while keep and self._est([system, *keep, ask], tools) + 500 > prompt_limit(self.p):
            keep = keep[1:]
            while keep and keep[0]["role"] == "tool":
                keep = keep[1:]
        self._call([system, *keep, ask], tools, 500, 0.1)
        summary = f"Summary of earlier work:\n{self.t.prose(self.p.summary_tokens)}"
        return [system, {"role": "user", "content": summary}]


def flatten(steps: list[Step] | tuple[Step, ...]) -> list[Call]:
    """Every call of a script, depth first (sub-agents in spawn order)."""
    out: list[Call] = []
    for s in steps:
        if isinstance(s, Call):
            out.append(s)
        else:
            for agent in s.agents:
                out.extend(flatten(agent))
    return out
