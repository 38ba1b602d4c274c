"""Sessions shared by router replicas, on real Serve (two routers, two sim replicas, a real
redis-server): a session's turns whose prompts share no prefix (a compacted history, a
sub-agent) stay on the replica that served it, whichever router each turn reaches."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.config import IndexConfig, RouterConfig
from tests.stacks import deployed, redis_url, sim_model, stack_config

pytestmark = pytest.mark.slow
MODEL = "sim-sessions"


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, stack_redis: Any,
          serve_port: int) -> Iterator[str]:
    cfg = stack_config(
        serve_port, sim_model(MODEL, tiny_model_dir, replicas=2),
        index=IndexConfig(redis_url=redis_url(stack_redis),
                          namespace=f"sess{uuid.uuid4().hex[:8]}", timeout_s=0.5,
                          op_timeout_s=1.0),
        router=RouterConfig(replicas=2),
    )
    with deployed(cfg) as url:
        yield url


def _turn(url: str, text: str, session: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                   headers={"x-session-id": session})
    assert r.status_code == 200, r.text
    return r


def test_sessions_stick_across_router_replicas(stack: str) -> None:
    """Eight sessions, four turns each, interleaved. A router that had not seen a session
    would pick by load and tie-breaks (about even odds per session), so a per-router
    session table fails this almost surely; a shared one passes."""
    sessions = [f"agent-{uuid.uuid4().hex}" for _ in range(8)]
    routers: dict[str, set[str]] = {s: set() for s in sessions}
    replicas: dict[str, set[str]] = {s: set() for s in sessions}
    for turn in range(4):
        for s in sessions:
            r = _turn(stack, f"{turn} unrelated prompt {uuid.uuid4().hex} " * 20, s)
            assert r.headers["x-kvroute-predicted-cached-tokens"] == "0"  # no prefix help
            routers[s].add(r.headers["x-kvroute-router"])
            replicas[s].add(r.headers["x-kvroute-replica"])
    assert all(len(reps) == 1 for reps in replicas.values()), replicas
    both = sum(len(rs) == 2 for rs in routers.values())
    assert both >= 4, f"only {both} of 8 sessions reached both routers: {routers}"
