"""Admission on real Serve (one sim replica prefilling 4000 tok/s, real routing stats):
while the replica is backed up, requests wait at the router and a short prompt sent
after a long one is served first; without admission it would queue behind it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-admission"
RATE = 4000.0  # the sim replica's prefill tok/s (also the router's prior)


@pytest.fixture(scope="module")
def url(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    model = sim_model(MODEL, tiny_model_dir, tpot_s=0.001, prefill_tok_s=RATE,
                      max_ongoing_requests=16)
    with deployed(stack_config(serve_port, model)) as base:
        yield base


async def _complete(client: httpx.AsyncClient, first: int, n: int) -> float:
    """Sends ``n`` distinct token ids; returns the wall-clock time the reply arrived."""
    body = {"model": MODEL, "prompt": [10 + (first + i) % 3000 for i in range(n)],
            "max_tokens": 2}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return time.monotonic()


async def _scenario(url: str) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for i in range(3):  # the replica reports prefill counters and a stats time
            await _complete(client, 100 * i, 400)
        await asyncio.sleep(2.5)  # Serve pushes routing stats every second
        first = asyncio.create_task(_complete(client, 1, 6000))  # 1.5 s of prefill
        await asyncio.sleep(0.2)
        long = asyncio.create_task(_complete(client, 2, 6000))
        await asyncio.sleep(0.2)
        short = asyncio.create_task(_complete(client, 3, 100))
        await first
        return await long, await short


def test_short_prompt_overtakes_a_held_long_one(url: str) -> None:
    long_done, short_done = asyncio.run(_scenario(url))
    # FIFO on the replica would finish the short one ~30 ms after the long one.
    assert short_done < long_done - 0.5, (long_done - short_done)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert "kvroute_admission_wait_seconds_count" in metrics
