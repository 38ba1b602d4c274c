"""Router replicas autoscaled under ``server.ingress: direct``, on real Serve.

The clients connect to the router replicas' own listeners, so Serve's proxy and handles
see none of the load and Serve's own count would keep one replica. Each router replica
reports the requests open on its listener (``deploy.autoscale.router``): concurrent
streams over ``target_ongoing_requests`` start a second router replica, which shares the
port (SO_REUSEPORT) and takes new connections; when the load stops, Serve stops it again.
No request fails meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import IndexConfig, KvrouteConfig, RouterConfig, ServerConfig
from deploy.config.autoscale import AutoscalingConfig
from deploy.serve.builder import ROUTER_DEPLOYMENT
from tests.conftest import free_port
from tests.stacks import deployed, sim_model

pytestmark = [pytest.mark.slow, pytest.mark.autoscaling, pytest.mark.load]
MODEL = "router-auto-sim"
CLIENTS = 6  # streams open at once: 3x the routers' target


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path) -> Iterator[str]:
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2, target_ongoing_requests=2.0,
                                upscale_delay_s=0.5, downscale_delay_s=2.0,
                                metrics_interval_s=0.5, look_back_period_s=2.0)
    cfg = KvrouteConfig(
        models=[sim_model(MODEL, tiny_model_dir, tpot_s=0.02, max_ongoing_requests=16)],
        index=IndexConfig(), router=RouterConfig(autoscaling=scaling),
        server=ServerConfig(host="127.0.0.1", port=free_port(), ingress="direct"))
    with deployed(cfg) as url:
        yield url


def _routers() -> int:
    """Router replicas Serve runs or starts (its autoscaler's decision)."""
    from deploy.cli.console import serve_replica_states
    from deploy.serve.runtime import APP_NAME

    states = serve_replica_states(APP_NAME).get(ROUTER_DEPLOYMENT, {})
    return sum(n for state, n in states.items() if getattr(state, "value", state) != "STOPPING")


async def _streams(url: str, seconds: float) -> tuple[list[tuple[int, bool]], list[int]]:
    """``CLIENTS`` clients streaming back to back, each request on a new connection (so the
    kernel can give it to a new router replica); (status, ended with [DONE]) per request,
    and the router replicas each half second."""
    results: list[tuple[int, bool]] = []
    counts: list[int] = []
    end = time.monotonic() + seconds

    async def client(k: int) -> None:
        i = 0
        while time.monotonic() < end:
            body = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [
                {"role": "user", "content": f"client {k} request {i} " + "pad " * 50}]}
            async with httpx.AsyncClient(timeout=60) as http, \
                    http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines()]
                results.append((r.status_code, "data: [DONE]" in lines))
            i += 1

    async def sampler() -> None:
        while time.monotonic() < end:
            counts.append(await asyncio.to_thread(_routers))
            await asyncio.sleep(0.5)

    await asyncio.gather(sampler(), *(client(k) for k in range(CLIENTS)))
    return results, counts


def test_open_streams_scale_the_routers_up_then_down(stack: str) -> None:
    assert _routers() == 1
    t0 = time.monotonic()
    results, counts = asyncio.run(_streams(stack, 15.0))
    assert results and all(r == (200, True) for r in results), results
    assert max(counts) == 2, f"no router scale-up: router replicas over time {counts}"
    print(f"{len(results)} streams, {CLIENTS} at a time; router replicas each 0.5 s: "
          f"{counts} ({time.monotonic() - t0:.1f} s)")

    deadline = time.monotonic() + 40
    while _routers() > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _routers() == 1, "the routers did not scale back down"
    r = httpx.post(f"{stack}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "after"}]})
    assert r.status_code == 200, r.text
