"""The in-process benches' one timing loop: process CPU (and wall) time of a call, and
the median over runs. Process time counts every thread of this process, so a call that
hands work to a pool is charged for it; the median keeps one slow run (a GC, a neighbour
on the shared machine) out of the figure."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class Timing:
    cpu_s: float = 0.0
    wall_s: float = 0.0


@contextlib.contextmanager
def timing() -> Iterator[Timing]:
    """The block's process CPU and wall seconds, filled in when it ends."""
    out = Timing()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield out
    finally:
        out.cpu_s, out.wall_s = time.process_time() - cpu, time.perf_counter() - wall


def cpu_s(fn: Callable[[], object]) -> float:
    """Process CPU seconds of one call."""
    with timing() as t:
        fn()
    return t.cpu_s


def median_cpu_s(fn: Callable[[], object], runs: int, per_run: int = 1) -> float:
    """The median over ``runs`` of process CPU seconds per call, ``per_run`` calls a run."""
    def run() -> None:
        for _ in range(per_run):
            fn()

    return statistics.median(cpu_s(run) for _ in range(runs)) / per_run


async def median_cpu_s_async(call: Callable[[], Awaitable[object]], runs: int,
                             per_run: int = 1) -> float:
    """``median_cpu_s`` of a coroutine function, awaited on the running loop."""
    samples = []
    for _ in range(runs):
        with timing() as t:
            for _ in range(per_run):
                await call()
        samples.append(t.cpu_s / per_run)
    return statistics.median(samples)
