"""Generation on its own: a stream cut mid-way resumes through the core, usage counts
against the original prompt, and without resumes left the failure reaches the caller.
(The whole path on real Serve: tests/router/test_faults.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from router import telemetry
from router.generation import Generation
from router.load import LoadTracker
from router.selection import RouteRequest

PROMPT = [5, 6, 7]


class Stream:
    """What a handle's response generator does: messages, then maybe a failure."""

    def __init__(self, msgs: list[dict[str, Any]], fail: bool) -> None:
        self._it = iter(msgs)
        self.fail, self.cancelled = fail, False

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        for msg in self._it:
            return msg
        if self.fail:
            raise ConnectionError("replica died")
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class Core:
    def __init__(self, max_resumes: int, then: list[dict[str, Any]]) -> None:
        self.config = SimpleNamespace(router=SimpleNamespace(max_resumes=max_resumes))
        self.loads = LoadTracker()
        self.then, self.resumed_from = then, None

    def on_first_token(self) -> None: ...

    async def on_final(self, model: str, msg: dict[str, Any]) -> None: ...

    async def resume(self, gen: Generation, err: Exception) -> dict[str, Any]:
        self.resumed_from = (gen.replica, list(gen.sent))
        other = make(self, "r2", self.then, fail=False)
        return gen.adopt(other)


def chunk(text: str, ids: list[int]) -> dict[str, Any]:
    return {"text": text, "n": len(ids), "ids": ids}


def make(core: Core, replica: str, msgs: list[dict[str, Any]], fail: bool) -> Generation:
    ticket = core.loads.begin("m", replica, 3)
    gen = Generation("m", replica, "router", 0, len(PROMPT), msgs[0], Stream(msgs[1:], fail),  # type: ignore[arg-type]
                     core, ticket, telemetry.RequestInfo(model="m"))  # type: ignore[arg-type]
    gen.request = RouteRequest("m", PROMPT, {"max_tokens": 6}, "req", {}, None)
    return gen


async def drain(gen: Generation) -> list[dict[str, Any]]:
    return [m async for m in gen.messages()]


def test_a_cut_stream_resumes_and_reports_whole_usage() -> None:
    final = {"replica": "r2", "finish_reason": "length", "stop_sequence": None,
             "usage": {"prompt_tokens": 6, "completion_tokens": 3, "cached_tokens": 5}}
    core = Core(max_resumes=1, then=[chunk("d", [4]), chunk("ef", [5, 6]), final])
    gen = make(core, "r1", [chunk("a", [1]), chunk("bc", [2, 3])], fail=True)
    msgs = asyncio.run(drain(gen))
    assert core.resumed_from == ("r1", [1, 2, 3])  # only tokens whose text went out
    assert "".join(m.get("text", "") for m in msgs) == "abcdef"
    assert gen.replica == "r2" and gen.sent == [1, 2, 3, 4, 5, 6]
    assert msgs[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "cached_tokens": 3}
    assert core.loads.get("m", "r1").ongoing == core.loads.get("m", "r2").ongoing == 0


def test_without_resumes_left_the_failure_reaches_the_caller() -> None:
    core = Core(max_resumes=0, then=[])
    gen = make(core, "r1", [chunk("a", [1])], fail=True)
    with pytest.raises(ConnectionError):
        asyncio.run(drain(gen))
    assert core.resumed_from is None and gen._info.failed
    assert gen._rest.cancelled  # type: ignore[attr-defined]
