"""``ops.bench.leases.model``: the virtual-time lease model runs the real SimCore and
SessionGaps; its bounds must hold (no policy above the infinite cache)."""

from __future__ import annotations

import argparse

from ops.bench.harness.workloads import AgentParams, AgentWorkload, Call, flatten
from ops.bench.leases.model import _Run


def args(**kw: float) -> argparse.Namespace:
    base = dict(duration=40.0, sessions=6, replicas=2, seed=0, kv_blocks=200,
                lease_fraction=0.5, prefill_tok_s=20000.0, tpot_s=0.01, tool_time_s=2.0,
                user_time_s=10.0, compact_tokens=20000)
    return argparse.Namespace(**{**base, **kw})


def test_no_policy_beats_the_infinite_cache_and_leases_are_counted() -> None:
    runs = {p: _Run(p, args()).run() for p in ("off", "leases", "infinite")}
    assert runs["off"].requests > 20
    for policy in ("off", "leases"):
        assert runs[policy].cached_ratio <= runs["infinite"].cached_ratio
    c = runs["leases"].counts
    assert c.granted > 0 and c.hit + c.expired + c.evicted <= c.granted
    assert runs["off"].counts.granted == 0 and runs["off"].renewals == 0
    assert runs["infinite"].pinned_fraction < 0.01  # a cache that large is never full


def test_the_oracle_leases_only_what_the_next_turn_reads() -> None:
    calls: list[Call] = flatten(AgentWorkload(AgentParams(subagent_prob=0.0)).session(0))
    first, second = calls[0], calls[1]
    lease = _Run.oracle_lease(first.request.body["messages"], calls[1:])
    assert lease == second.think_s + 1.0
    assert _Run.oracle_lease(first.request.body["messages"], []) == 0.0  # the last turn
    other = [{"role": "system", "content": "compacted"}]
    compacted = Call(type(second.request)(second.request.key, second.request.path,
                                          {**second.request.body, "messages": other}), 1.0)
    assert _Run.oracle_lease(first.request.body["messages"], [compacted]) == 0.0
