"""``ops.bench.leases.bench``: the working set it reports against the device cache."""

from __future__ import annotations

import argparse

from ops.bench.harness.client import Record
from ops.bench.leases.bench import working_set


def rec(key: str, session: str, prompt: int, cached: int = 0) -> Record:
    return Record(key, session, 0.0, ttft_s=0.1, prompt_tokens=prompt, cached_tokens=cached)


def test_the_working_set_holds_the_shared_prefix_once_and_leaves_sub_agents_out() -> None:
    records = [rec("s1.t0", "s1", 9000, 7552),  # the whole shared prefix was cached
               rec("s2.t0", "s2", 9000, 3008),  # its tail had been evicted
               rec("s1.t1", "s1", 21000),
               rec("s1.a1.0.t0", "s1.a1.0", 100, 50)]  # a sub-agent's turn
    got = working_set(records, argparse.Namespace(concurrency=24, replicas=2, kv_blocks=460))
    assert got["shared_tokens"] == 7552 and got["mean_prompt_tokens"] == 13000
    # 7552 + 12 sessions x (13000 - 7552) tokens, over 460 blocks of 64 tokens
    assert got["working_set_ratio"] == round((7552 + 12 * 5448) / (460 * 64), 2)
