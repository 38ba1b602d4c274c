"""Model selection on real Serve with two sim-engine models behind one alias:
the preferred model serves an idle group, a conversation stays on the model
whose cache is warm, and when the preferred model is full the group falls back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.config import GroupMember, ModelGroup
from tests.stacks import deployed, sim_model, stack_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(ray_local: None, tiny_model_dir: Path, serve_port: int) -> Iterator[str]:
    big = sim_model("big", tiny_model_dir, max_ongoing_requests=1)
    coder = ModelGroup(name="coder", models=[GroupMember(model="big", weight=1.0),
                                             GroupMember(model="small", weight=0.6)])
    small = sim_model("small", tiny_model_dir, context_window=8192)
    cfg = stack_config(serve_port, big, small, groups=[coder])
    with deployed(cfg) as url:
        yield url


def _chat(url: str, model: str, text: str, session: str | None = None) -> httpx.Response:
    headers = {"x-session-id": session} if session else {}
    body = {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_group_is_listed_with_context_windows(stack: str) -> None:
    listed = httpx.get(f"{stack}/v1/models").json()["data"]
    # max_model_len: the model's context_window; a group's, its smallest member's
    assert {m["id"]: m["max_model_len"] for m in listed} == {
        "big": 32768, "small": 8192, "coder": 8192}
    assert all(m["object"] == "model" and m["owned_by"] == "kvroute" for m in listed)


def test_idle_group_prefers_its_first_model(stack: str) -> None:
    assert _chat(stack, "coder", "hello there").headers["x-kvroute-model"] == "big"


def test_warm_conversation_stays_on_the_model_it_started_on(stack: str) -> None:
    prefix = "a long agent conversation " * 60
    assert _chat(stack, "small", prefix).headers["x-kvroute-model"] == "small"
    # Sent to the group now: its KV lives on small, re-prefilling on big costs more.
    r = _chat(stack, "coder", prefix + " next turn", session="s-1")
    assert r.headers["x-kvroute-model"] == "small"
    assert int(r.headers["x-kvroute-predicted-cached-tokens"]) > 0


async def _burst(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"model": "coder", "max_tokens": 40,
                "messages": [{"role": "user", "content": "busy work"}]}
        return await asyncio.gather(*(client.post(f"{url}/v1/chat/completions", json=body)
                                      for _ in range(n)))


def test_group_falls_back_when_preferred_model_is_full(stack: str) -> None:
    replies = asyncio.run(_burst(stack, 4))  # big takes one at a time (max_ongoing 1)
    assert all(r.status_code == 200 for r in replies)
    served = [r.headers["x-kvroute-model"] for r in replies]
    assert "big" in served and "small" in served, served
