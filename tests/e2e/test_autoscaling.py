"""Serve autoscaling that routing understands (sim engine), on one stack of two models.

``sim-auto`` (Serve's default policy): load raises it from 1 to >= 3 replicas and the
router uses the new ones at once; when load stops it scales down and no request fails.

``sim-ttft`` (the kvroute policy): a few long prompts, never more ongoing requests than
``target_ongoing_requests`` (so Serve's default policy sees a replica at its target and
keeps one; tests/deploy/autoscale/test_autoscale_serve.py shows it on the same numbers), hold
seconds of prefill: the kvroute policy scales up on that backlog, then back down when it
is gone, and no request fails meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config.autoscale import AutoscalingConfig
from tests.stacks import deployed, sim_model, stack_config

pytestmark = [pytest.mark.slow, pytest.mark.autoscaling, pytest.mark.load]
MODEL = "sim-auto"
TTFT_MODEL = "sim-ttft"
CONCURRENCY = 2  # = sim-ttft's target_ongoing_requests: the default's error ratio stays <= 1
PROMPT_WORDS = 1000  # ~1 s of prefill each at 2000 tok/s, against a 1.5 s TTFT target
SCALE_UP_CAP_S = 90.0  # the most the scale-up load waits for its third replica


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=3, target_ongoing_requests=1.0,
                                upscale_delay_s=1.0, downscale_delay_s=4.0)
    model = sim_model(MODEL, tiny_model_dir, autoscaling=scaling, max_ongoing_requests=4,
                      tpot_s=0.05, prefill_tok_s=50000.0)
    ttft = AutoscalingConfig(
        policy="kvroute", ttft_target_s=1.5, startup_s=2.0, min_replicas=1, max_replicas=3,
        target_ongoing_requests=float(CONCURRENCY), upscale_delay_s=0.5,
        downscale_delay_s=3.0, metrics_interval_s=0.5, look_back_period_s=5.0)
    ttft_model = sim_model(TTFT_MODEL, tiny_model_dir, autoscaling=ttft,
                           max_ongoing_requests=8, tpot_s=0.02, prefill_tok_s=2000.0)
    with deployed(stack_config(serve_port, model, ttft_model)) as url:
        yield url


def _replicas(url: str, model: str = MODEL) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["replicas"].get(model, 0))


async def _load(url: str, seconds: float, concurrency: int,
                until_replicas: int = 0) -> list[tuple[int, str]]:
    """``concurrency`` clients for ``seconds``; with ``until_replicas``, for ``seconds``
    after that many replicas are serving (at most ``SCALE_UP_CAP_S``): how soon a replica
    starts depends on the host's load, what the router does with it once it runs does not."""
    out: list[tuple[int, str]] = []
    end = time.monotonic() + (SCALE_UP_CAP_S if until_replicas else seconds)

    async def watch() -> None:
        nonlocal end
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < end:
                health = (await client.get(f"{url}/health")).json()
                if int(health["replicas"].get(MODEL, 0)) >= until_replicas:
                    end = min(end, time.monotonic() + seconds)
                    return
                await asyncio.sleep(0.5)

    async def worker(k: int) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            i = 0
            while time.monotonic() < end:
                body = {"model": MODEL, "max_tokens": 30, "messages": [
                    {"role": "user", "content": f"user {k} request {i} " + "pad " * 100}]}
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                out.append((r.status_code, r.headers.get("x-kvroute-replica", "")))
                i += 1

    await asyncio.gather(*(worker(k) for k in range(concurrency)),
                         *([watch()] if until_replicas else []))
    return out


def test_scale_up_then_down_without_failures(stack: str) -> None:
    assert _replicas(stack) == 1
    t0 = time.monotonic()
    results = asyncio.run(_load(stack, 8.0, concurrency=8, until_replicas=3))
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


def _asked(model: str) -> int:
    """Replicas Serve runs or is starting for ``model`` (its autoscaler's decision)."""
    from deploy.cli.console import serve_replica_states
    from deploy.serve.runtime import APP_NAME

    states = serve_replica_states(APP_NAME).get(model, {})
    return sum(n for state, n in states.items() if getattr(state, "value", state) != "STOPPING")


async def _long_prompts(url: str, seconds: float) -> tuple[list[int], list[int]]:
    """``CONCURRENCY`` clients sending distinct long prompts back to back; the replicas
    Serve runs or starts, sampled each second."""
    codes: list[int] = []
    counts: list[int] = []
    end = time.monotonic() + seconds

    async def client(k: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            i = 0
            while time.monotonic() < end:
                body = {"model": TTFT_MODEL, "max_tokens": 8, "messages": [{
                    "role": "user", "content": f"client {k} prompt {i} " + "pad " * PROMPT_WORDS}]}
                codes.append((await http.post(f"{url}/v1/chat/completions", json=body))
                             .status_code)
                i += 1

    async def sampler() -> None:
        while time.monotonic() < end:
            counts.append(await asyncio.to_thread(_asked, TTFT_MODEL))
            await asyncio.sleep(1.0)

    await asyncio.gather(sampler(), *(client(k) for k in range(CONCURRENCY)))
    return codes, counts


def test_scales_up_on_prefill_backlog_then_down(stack: str) -> None:
    assert _replicas(stack, TTFT_MODEL) == 1
    t0 = time.monotonic()
    codes, counts = asyncio.run(_long_prompts(stack, 15.0))
    assert codes and all(c == 200 for c in codes), f"failed requests: {codes}"
    assert max(counts) >= 2, f"no scale-up on the backlog: replicas over time {counts}"
    print(f"{len(codes)} long prompts, {CONCURRENCY} at a time; replicas each second: "
          f"{counts} ({time.monotonic() - t0:.1f} s)")

    t1 = time.monotonic()
    deadline = t1 + 40
    while _replicas(stack, TTFT_MODEL) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert _replicas(stack, TTFT_MODEL) == 1
    print(f"back to 1 replica {time.monotonic() - t1:.1f} s after the load stopped")
