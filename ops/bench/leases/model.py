"""KV leases in virtual time: the agent workload on ``SimCore`` replicas with the router's
``SessionGaps``; no Ray, no wall clock, so a run is deterministic and takes seconds.

    kvroute bench lease-model --sessions 24 --kv-blocks 580 --tool-time-s 3 \\
        --user-time-s 30

It reads what the live bench (``ops.bench.leases.bench``) cannot see from outside the replicas:
what became of the leased blocks (``workers.engines.sim.kv.LeaseCounts``: granted, refused by the
cap, hit by a later turn, expired unused, evicted before their deadline) and how much of the
cache the running requests pin. Policies, one run each, same seed:

* ``off``: no leases (LRU);
* ``leases``: ``router.routing.leases`` as configured by default (by how the turn ended, renewals
  of final answers included);
* ``oracle``: leases that know each session's next turn: the exact pause + 1 s, none after
  a session's last turn, no cap, the leased block needed last evicted first. No lease
  policy can know more, so it bounds what leases can gain here;
* ``infinite``: no leases and a cache that never evicts (the bound of any policy).

Simplifications: a turn goes to the replica that holds the longest cached prefix of it
(ties: fewer requests), where kvroute's router sends a session when load allows; token ids
are the rendered prompt's bytes four at a time (~4 characters a token, near the tiny
model's tokenizer); sub-agents are left out (``subagent_prob`` 0); a renewal is the turn's
prompt and its final answer, ``max_tokens`` 1, as the router sends it.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cache_service.hashing import block_hashes
from deploy.config.router import LeaseConfig
from ops.bench.harness.workloads import AgentParams, AgentWorkload, Call, flatten
from router.routing.leases import SessionGaps
from workers.engines.sim.core import SimCore, SimFinish, SimParams, SimRequest, SimToken
from workers.engines.sim.kv import LeaseCounts, SimKv

POLICIES = ("off", "leases", "oracle", "infinite")


class FarthestFirst(SimKv):
    """The oracle's engine: among leased blocks, the one needed last goes first."""

    def make_room(self, n: int, now: float) -> None:
        if now >= self._next_expiry:
            self._expire(now)
        victims = []
        for _ in range(n - self.room()):
            if self.free:
                h, _ = self.free.popitem(last=False)
            elif self.leased:
                h = max(self.leased, key=self.deadline.__getitem__)
                del self.leased[h]
                del self.deadline[h]
                self.lease_counts.evicted += 1
            else:
                break
            victims.append(h)
        self._demote(victims)


def prompt_hashes(messages: list[dict[str, Any]], tools: list[dict[str, Any]], extra: str,
                  block_size: int) -> tuple[list[int], int]:
    """(block hashes, tokens) of a chat prompt rendered append-only (so a turn's prompt
    starts with the previous turn's), four bytes a token."""
    parts = [json.dumps(tools)]
    parts += [f"<{m['role']}>{m.get('content') or ''}{json.dumps(m.get('tool_calls'))}"
              for m in messages]
    raw = ("".join(parts) + extra).encode()
    ids = np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<u4")
    return list(block_hashes(ids, block_size, 0)), len(ids)


@dataclass(slots=True)
class _Turn:
    slot: int
    replica: int
    session: str
    start: float
    final: bool
    hashes: tuple[list[int], int]
    first_token: float | None = None


@dataclass(slots=True)
class Outcome:
    policy: str
    requests: int = 0
    ttft_p50_s: float = 0.0
    ttft_mean_s: float = 0.0
    cached_ratio: float = 0.0
    renewals: int = 0
    pinned_fraction: float = 0.0  # of the cache, in use by running requests (mean)
    working_set_ratio: float = 0.0  # per replica, over the cache (``ops.bench.leases.bench``)
    counts: LeaseCounts = field(default_factory=LeaseCounts)


class _Run:
    """One policy's run: sessions in ``args.sessions`` slots, closed loop."""

    def __init__(self, policy: str, args: argparse.Namespace) -> None:
        self.policy, self.args = policy, args
        self.params = AgentParams(seed=args.seed, compact_tokens=args.compact_tokens,
                                  tool_time_s=args.tool_time_s, user_time_s=args.user_time_s,
                                  subagent_prob=0.0)
        self.workload = AgentWorkload(self.params)
        blocks = 1 << 30 if policy == "infinite" else args.kv_blocks
        sim = SimParams(kv_blocks=blocks, prefill_tok_s=args.prefill_tok_s,
                        tpot_s=args.tpot_s, lease_fraction=1.0 if policy == "oracle"
                        else args.lease_fraction)
        self.cores = [SimCore(sim, "m", f"r{i}") for i in range(args.replicas)]
        if policy == "oracle":
            for core in self.cores:
                core.kv.__class__ = FarthestFirst
        self.gaps = SessionGaps(LeaseConfig(enabled=policy == "leases"))
        self.sessions = itertools.count()
        self.ids = itertools.count()
        self.scripts: dict[int, list[Call]] = {}
        self.wake: list[tuple[float, int, int]] = []  # (time, seq, slot)
        self.running: dict[str, _Turn | None] = {}  # None: a renewal
        self.done: list[_Turn] = []
        self.cached = self.prompt = self.renewals = 0
        self.pinned: list[float] = []

    def next_session(self, slot: int, now: float) -> None:
        self.scripts[slot] = flatten(self.workload.session(next(self.sessions)))
        self.schedule(slot, now)

    def schedule(self, slot: int, now: float) -> None:
        if not self.scripts[slot]:
            self.next_session(slot, now)
            return
        heapq.heappush(self.wake, (now + self.scripts[slot][0].think_s, next(self.ids), slot))

    def send(self, slot: int, now: float) -> None:
        call = self.scripts[slot].pop(0)
        body, session = call.request.body, call.request.session
        hashes = prompt_hashes(body["messages"], body["tools"], "", self.cores[0].params.block_size)
        probe = SimRequest("probe", hashes[0], hashes[1], 1)
        replica = max(range(len(self.cores)), key=lambda i: (
            self.cores[i].cached_prefix_blocks(probe), -self.cores[i].load().ongoing_requests))
        self.pinned.append(float(np.mean([c.load().kv_usage for c in self.cores])))
        lease = self.gaps.turn(session, now)
        if self.policy == "oracle":
            lease = self.oracle_lease(body["messages"], self.scripts[slot])
        final = body["max_tokens"] == self.params.final_tokens
        rid = f"q{next(self.ids)}"
        self.running[rid] = _Turn(slot, replica, session, now, final, hashes)
        self.cores[replica].submit(
            SimRequest(rid, hashes[0], hashes[1], body["max_tokens"], lease_s=lease), now)

    @staticmethod
    def oracle_lease(messages: list[dict[str, Any]], rest: list[Call]) -> float:
        """The exact pause + 1 s, if the session's next turn starts with this prompt (not
        after its last turn, nor before a compacted history)."""
        if not rest:
            return 0.0
        after = rest[0].request.body["messages"]
        return rest[0].think_s + 1.0 if after[: len(messages)] == messages else 0.0

    def finish(self, fin: SimFinish) -> None:
        turn = self.running.pop(fin.request_id)
        if turn is None:
            return
        self.done.append(turn)
        if turn.start <= self.args.duration:
            self.cached += fin.cached_tokens
            self.prompt += fin.prompt_tokens
        renew = self.gaps.ended(turn.session, fin.time, tool_call=not turn.final)
        if renew > 0:
            self.renew(turn, fin.time, renew)
        self.schedule(turn.slot, fin.time)

    def renew(self, turn: _Turn, now: float, lease: float) -> None:
        """The router's renewal after a final answer: the turn's prompt again, prefill only
        (the reply's blocks are left out: the next turn's history carries the workload's
        scripted reply, not the sim's, so the live bench cannot hit them either)."""
        rid = f"r{next(self.ids)}"
        self.renewals += 1
        self.running[rid] = None
        self.cores[turn.replica].submit(
            SimRequest(rid, turn.hashes[0], turn.hashes[1], 1, lease_s=lease), now)

    def run(self) -> Outcome:
        for slot in range(self.args.sessions):
            self.next_session(slot, 5.0 * slot / self.args.sessions)  # a 5 s ramp
        while True:
            t_core = min((t for c in self.cores if (t := c.next_event_time()) is not None),
                         default=float("inf"))
            t_wake = self.wake[0][0] if self.wake else float("inf")
            if t_wake <= t_core and t_wake <= self.args.duration:
                _, _, slot = heapq.heappop(self.wake)
                self.send(slot, t_wake)
            elif t_core < float("inf") and self.running:
                self.advance(t_core)
            else:
                return self.outcome()

    def advance(self, now: float) -> None:
        for core in self.cores:
            for out in core.advance(now):
                turn = self.running.get(out.request_id)
                if isinstance(out, SimToken) and turn is not None and out.index == 0:
                    turn.first_token = out.time
                elif isinstance(out, SimFinish):
                    self.finish(out)

    def outcome(self) -> Outcome:
        ttft = [t.first_token - t.start for t in self.done
                if t.start <= self.args.duration and t.first_token is not None]
        counts = LeaseCounts()
        for core in self.cores:
            for k, v in asdict(core.kv.lease_counts).items():
                setattr(counts, k, getattr(counts, k) + v)
        return Outcome(
            self.policy, len(ttft), float(np.median(ttft)), float(np.mean(ttft)),
            self.cached / max(1, self.prompt), self.renewals, float(np.mean(self.pinned)),
            self.working_set(), counts)

    def working_set(self) -> float:
        """Per replica over the cache, as ``ops.bench.leases.bench`` computes it."""
        shared = prompt_hashes([{"role": "system", "content": self.workload.system}],
                               self.workload.tools, "", 1)[1]
        mean = self.prompt / max(1, sum(1 for t in self.done if t.start <= self.args.duration))
        per = shared + self.args.sessions / self.args.replicas * max(0.0, mean - shared)
        return per / (self.args.kv_blocks * self.cores[0].params.block_size)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default=",".join(POLICIES), help=f"Of {POLICIES}.")
    p.add_argument("--duration", type=float, default=300.0, help="Virtual seconds of load.")
    p.add_argument("--sessions", type=int, default=24, help="Sessions alive at once.")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=580, help="Sim device blocks per replica.")
    p.add_argument("--lease-fraction", type=float, default=0.5)
    p.add_argument("--prefill-tok-s", type=float, default=20000.0)
    p.add_argument("--tpot-s", type=float, default=0.01)
    p.add_argument("--tool-time-s", type=float, default=3.0)
    p.add_argument("--user-time-s", type=float, default=30.0)
    p.add_argument("--compact-tokens", type=int, default=20000)


def run(args: argparse.Namespace) -> int:
    print("policy    requests  TTFT p50   mean  cached  pinned  ws/cache  renewals  leased "
          "blocks: granted refused hit expired evicted")
    for policy in args.policies.split(","):
        o = _Run(policy, args).run()
        c = o.counts
        print(f"{o.policy:9} {o.requests:8}  {o.ttft_p50_s:8.3f} {o.ttft_mean_s:6.3f} "
              f"{100 * o.cached_ratio:6.1f}% {100 * o.pinned_fraction:6.0f}% "
              f"{o.working_set_ratio:8.2f}  {o.renewals:8}  {c.granted:21} {c.refused:7} "
              f"{c.hit:4} {c.expired:7} {c.evicted:7}", flush=True)
    return 0
