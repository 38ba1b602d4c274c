"""The in-process benches' timing loop (``ops.bench.harness.micro``): CPU time counts work,
not sleep; the median is per call."""

from __future__ import annotations

import asyncio
import time

from ops.bench.harness.micro import cpu_s, median_cpu_s, median_cpu_s_async, timing


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_counts_work_not_sleep() -> None:
    assert cpu_s(lambda: time.sleep(0.05)) < 0.02
    assert cpu_s(lambda: _spin(0.03)) >= 0.03
    with timing() as t:
        time.sleep(0.05)
    assert t.wall_s >= 0.05 and t.cpu_s < 0.02


def test_median_is_per_call() -> None:
    per_call = median_cpu_s(lambda: _spin(0.005), runs=3, per_run=4)
    assert 0.005 <= per_call < 0.02

    async def spin() -> None:
        _spin(0.005)

    assert 0.005 <= asyncio.run(median_cpu_s_async(spin, runs=3, per_run=4)) < 0.02
