"""``router.assign_timeout_s`` on real Serve: a request that Serve's handle queue has not
placed on a replica is cancelled and sent again. Every request is still answered once, and
the worker runs each one once: a cancelled unplaced call is never also run.

A stranded request (seen once in an autoscaling run) cannot be caused on purpose, so here the
queue is real but legitimate. One replica takes one request at a time
(``max_ongoing_requests: 1``), so the other requests wait unplaced in Serve's queue past
a short ``assign_timeout_s``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import RouterConfig
from tests.stacks import counter, deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-unplaced"
REQUESTS = 3


@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.05, max_ongoing_requests=1)
    cfg = stack_config(serve_port, model, router=RouterConfig(assign_timeout_s=0.3))
    with deployed(cfg) as u:
        yield u


def _started() -> int:
    """Requests the replica began (its autoscaling stats count user requests)."""
    from ray import serve

    from deploy.serve import runtime
    from workers.protocol import AutoscalingStats

    handle = serve.get_deployment_handle(MODEL, app_name=runtime.APP_NAME)
    stats = AutoscalingStats.from_serve(handle.record_autoscaling_stats.remote().result())
    assert stats is not None
    return stats.requests_total


async def _chats(url: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(f"{url}/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 12,
            "messages": [{"role": "user", "content": f"request {i} waits its turn"}],
        }) for i in range(REQUESTS)))


def test_requests_waiting_unplaced_are_sent_again_and_each_runs_once(url: str) -> None:
    retries, started = counter(url, "kvroute_retries_total"), _started()
    replies = asyncio.run(_chats(url))
    assert [r.status_code for r in replies] == [200] * REQUESTS, [r.text for r in replies]
    assert all(r.json()["usage"]["completion_tokens"] == 12 for r in replies)
    # each holds the replica ~0.6 s, so the last waited two turns: re-sent at least once
    assert counter(url, "kvroute_retries_total") - retries >= 1
    assert _started() - started == REQUESTS
