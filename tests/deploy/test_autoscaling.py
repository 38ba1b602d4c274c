"""Serve autoscaling that routing understands (sim engine): load raises a model from
1 to >= 3 replicas and the router uses the new ones at once; when load stops it
scales down and no request fails meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import AutoscalingConfig
from tests.stacks import deployed, sim_model, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.autoscaling]
MODEL = "sim-auto"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=3, target_ongoing_requests=1.0,
                                upscale_delay_s=1.0, downscale_delay_s=4.0)
    model = sim_model(MODEL, tiny_model_dir, autoscaling=scaling, max_ongoing_requests=4,
                      tpot_s=0.05, prefill_tok_s=50000.0)
    with deployed(stack_config(serve_port, model)) as url:
        yield url


def _replicas(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["replicas"].get(MODEL, 0))


async def _load(url: str, seconds: float, concurrency: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    end = time.monotonic() + seconds

    async def worker(k: int) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            i = 0
            while time.monotonic() < end:
                body = {"model": MODEL, "max_tokens": 30, "messages": [
                    {"role": "user", "content": f"user {k} request {i} " + "pad " * 100}]}
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                out.append((r.status_code, r.headers.get("x-kvroute-replica", "")))
                i += 1

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return out


def test_scale_up_then_down_without_failures(stack: str) -> None:
    assert _replicas(stack) == 1
    t0 = time.monotonic()
    results = asyncio.run(_load(stack, 25.0, concurrency=8))
    peak = _replicas(stack)
    assert all(code == 200 for code, _ in results)
    assert peak >= 3, f"only {peak} replicas under load"
    used = {rep for _, rep in results}
    assert len(used) >= 3, f"router used {len(used)} replicas"
    print(f"scaled 1 -> {peak} replicas under load; {len(results)} requests; "
          f"{len(used)} replicas served ({time.monotonic() - t0:.1f} s)")

    t1 = time.monotonic()
    trickle = asyncio.run(_load(stack, 20.0, concurrency=1))
    assert all(code == 200 for code, _ in trickle), "a request failed during scale-down"
    deadline = time.monotonic() + 60
    while _replicas(stack) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert _replicas(stack) == 1
    print(f"scaled down to 1 replica {time.monotonic() - t1:.1f} s after load dropped")
