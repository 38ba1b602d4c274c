"""Cluster-wide ``/metrics``: every router replica's samples, merged.

Each router replica pushes its Prometheus text to the ``MetricsHub`` deployment
every second; ``/metrics`` on any replica asks the hub for the merge. Counters
and histogram series with the same name and labels are summed across replicas;
gauges (per-replica load, already labelled by replica) take the latest value.
If the hub is unreachable, a replica answers with its own metrics only. ``/metrics`` is
open (docs/auth.md), so each router replica serves it from a ``MetricsCache``: at most one
push + merge per ``CACHE_S``, however many scrapes arrive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ray.serve.handle import DeploymentHandle

from router.metrics import REGISTRY

log = logging.getLogger(__name__)
PUSH_TIMEOUT_S = 2.0  # one push per second: a late one is simply dropped
CACHE_S = 1.0  # /metrics answers from a snapshot at most this old
_STALE_S = 30.0  # a replica silent this long is gone; drop its samples
Key = tuple[str, tuple[tuple[str, str], ...]]


class MetricsHub:
    """A tiny Serve deployment (one replica) holding each router replica's snapshot."""

    def __init__(self) -> None:
        self._snaps: dict[str, tuple[float, str]] = {}

    async def push(self, source: str, text: str) -> None:
        self._snaps[source] = (time.monotonic(), text)

    async def collect(self) -> str:
        now = time.monotonic()
        self._snaps = {k: v for k, v in self._snaps.items() if now - v[0] < _STALE_S}
        return merge([text for _, text in self._snaps.values()])


def merge(texts: list[str]) -> str:
    helps: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[Key, float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            helps.setdefault(fam.name, (fam.type, fam.documentation))
            series = values.setdefault(fam.name, {})
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue  # per-process creation stamps do not add up
                key = (s.name, tuple(sorted(s.labels.items())))
                gauge = fam.type == "gauge"
                series[key] = s.value if gauge else series.get(key, 0.0) + s.value
    return _render({n: h for n, h in helps.items() if values[n]}, values)


def _render(helps: dict[str, tuple[str, str]], values: dict[str, dict[Key, float]]) -> str:
    lines: list[str] = []
    for name, (kind, doc) in sorted(helps.items()):
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for (sample, labels), value in sorted(values[name].items()):
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{sample}{{{body}}} {value!r}" if body else f"{sample} {value!r}")
    return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def local_text() -> str:
    return generate_latest(REGISTRY).decode()


async def push_metrics(hub: DeploymentHandle | None, source: str,
                       timeout_s: float = PUSH_TIMEOUT_S) -> None:
    """Bounded: a hub that is restarting must not stall the caller's housekeeping."""
    if hub is not None:
        await asyncio.wait_for(hub.push.remote(source, local_text()), timeout_s)


async def render_metrics(hub: DeploymentHandle | None, source: str) -> str:
    if hub is None:
        return merge([local_text()])
    try:
        await push_metrics(hub, source)
        return await hub.collect.remote()
    except Exception as e:  # the hub is optional: degrade to this replica's view
        log.warning("metrics hub unavailable (%r); serving local metrics", e)
        return merge([local_text()])


class MetricsCache:
    """``render_metrics`` at most once per ``max_age_s``; concurrent callers share it."""

    def __init__(self, hub: DeploymentHandle | None, source: str, max_age_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._hub, self._source, self._max_age_s, self._clock = hub, source, max_age_s, clock
        self._task: asyncio.Task[str] | None = None
        self._at = 0.0

    async def text(self) -> str:
        now = self._clock()
        if self._task is None or (self._task.done() and now - self._at >= self._max_age_s):
            self._at = now
            self._task = asyncio.ensure_future(render_metrics(self._hub, self._source))
        return await asyncio.shield(self._task)  # a scraper that leaves cancels only itself
