"""The metrics hub's client side: merging replicas' texts, and a push that cannot stall
the router's housekeeping."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from router.app.metrics_hub import merge, push_metrics


class _Method:
    def __init__(self, answer: bool) -> None:
        self.answer, self.calls = answer, 0

    def remote(self, *args: Any) -> asyncio.Future[None]:
        self.calls += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.answer:
            fut.set_result(None)
        return fut  # unanswered: a hub replica that is not up yet


class _Hub:
    def __init__(self, answer: bool) -> None:
        self.push = _Method(answer)


async def test_push_to_a_silent_hub_gives_up_in_time() -> None:
    hub = _Hub(answer=False)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await push_metrics(hub, "r1", timeout_s=0.05)  # type: ignore[arg-type]
    assert time.monotonic() - start < 1.0 and hub.push.calls == 1


async def test_push_to_a_live_hub_returns() -> None:
    hub = _Hub(answer=True)
    await push_metrics(hub, "r1", timeout_s=0.05)  # type: ignore[arg-type]
    assert hub.push.calls == 1
    await push_metrics(None, "r1")  # no hub: nothing to do


def test_merge_sums_counters_across_replicas() -> None:
    a = '# HELP x_total x\n# TYPE x_total counter\nx_total{m="a"} 2.0\n'
    b = '# HELP x_total x\n# TYPE x_total counter\nx_total{m="a"} 3.0\n'
    assert 'x_total{m="a"} 5.0' in merge([a, b])


class _CountingHub:
    """A hub whose ``collect`` counts calls and answers once released."""

    def __init__(self) -> None:
        self.push = _Method(answer=True)
        self.collects = 0
        self.release = asyncio.Event()

    @property
    def collect(self) -> _CountingHub:
        return self

    def remote(self) -> asyncio.Future[str]:
        self.collects += 1
        return asyncio.ensure_future(self._answer(self.collects))

    async def _answer(self, n: int) -> str:
        await self.release.wait()
        return f"merge {n}\n"


async def test_metrics_cache_merges_once_per_second_for_any_number_of_scrapes() -> None:
    """/metrics is open, so a scrape flood must not cost a push and a
    cluster-wide merge each; concurrent scrapes share one, and it is reused for ~1 s."""
    from router.app.metrics_hub import CACHE_S, MetricsCache

    now = [100.0]
    hub = _CountingHub()
    cache = MetricsCache(hub, "r1", clock=lambda: now[0])  # type: ignore[arg-type]
    scrapes = [asyncio.ensure_future(cache.text()) for _ in range(50)]
    await asyncio.sleep(0)
    hub.release.set()
    assert set(await asyncio.gather(*scrapes)) == {"merge 1\n"}
    now[0] += CACHE_S / 2
    assert await cache.text() == "merge 1\n"
    now[0] += CACHE_S
    assert await cache.text() == "merge 2\n"
    assert hub.collects == 2 and hub.push.calls == 2
