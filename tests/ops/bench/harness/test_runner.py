"""The bench ``Runner``'s drain: a request cut at the drain timeout is recorded as itself
(its key, session and send time), not as an anonymous error at the end of the run (the
stranded request of an autoscale run first read as sent at t = 480 s, the drain's end)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ops.bench.harness.client import LoadSpec, Record, Runner
from ops.bench.harness.workloads import BenchRequest


class FakeClient:
    """Answers at once, except ``hang`` keys, which never answer."""

    def __init__(self, hang: set[str]) -> None:
        self.hang = hang

    async def send(self, req: BenchRequest, t0: float) -> Record:
        rec = Record(req.key, req.session, time.monotonic() - t0, ttft_s=0.01, e2e_s=0.01)
        if req.key in self.hang:
            await asyncio.sleep(3600)
        return rec


def test_a_request_cut_by_the_drain_keeps_its_key_and_send_time() -> None:
    runner = Runner(FakeClient({"s1.t2"}), LoadSpec(duration_s=0.3, drain_timeout_s=0.2),  # type: ignore[arg-type]
                    "t", show=False)

    async def driver(r: Runner) -> None:
        for i in range(3):
            r.spawn(r.call(BenchRequest(f"s1.t{i}", "/v1/chat/completions", {}, "s1")))
            await asyncio.sleep(0.05)

    records: list[Any] = asyncio.run(runner.run(driver))
    assert [r.key for r in records] == ["s1.t0", "s1.t1", "s1.t2"]
    cut = records[2]
    assert cut.session == "s1" and not cut.ok and cut.error.startswith("drain timeout")
    assert 0.05 <= cut.start_s < 0.45  # sent at ~0.1 s, not stamped at the drain's end (0.5 s)
    assert runner.inflight == 0
