"""Generation on its own: a stream cut mid-way resumes through its owner, usage counts
against the original prompt, without resumes left the failure reaches the caller, and a
client that leaves is charged only for what was generated.
(The whole path on real Serve: tests/e2e/test_faults.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router import telemetry
from router.auth.keys import ApiKeyConfig
from router.dispatch.dispatch import Started
from router.dispatch.generation import Generation
from router.routing.context import Candidate
from router.routing.load import LoadTracker
from router.routing.selection import RouteRequest
from workers.protocol import Chunk, Final, SamplingParams, Usage, WorkerMessage

PROMPT = [5, 6, 7]
KEY = ApiKeyConfig(name="k", key_sha256="0" * 64)


class Stream:
    """What a handle's response generator does: messages, then maybe a failure."""

    def __init__(self, msgs: list[WorkerMessage], fail: bool) -> None:
        self._it = iter(msgs)
        self.fail, self.cancelled = fail, False

    def __aiter__(self) -> AsyncIterator[WorkerMessage]:
        return self

    async def __anext__(self) -> WorkerMessage:
        for msg in self._it:
            return msg
        if self.fail:
            raise ConnectionError("replica died")
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class Owner:
    """A ``StreamOwner`` that resumes on replica r2 with scripted messages."""

    def __init__(self, max_resumes: int, then: list[WorkerMessage]) -> None:
        self.max_resumes, self.loads = max_resumes, LoadTracker()
        self.then, self.resumed_from = then, None
        self.finals: list[Final] = []
        self.refunds: list[int] = []
        self.first_tokens = 0

    def on_first_token(self) -> None:
        self.first_tokens += 1

    def on_final(self, model: str, final: Final) -> None:
        self.finals.append(final)

    def refund(self, key: ApiKeyConfig, tokens: int) -> None:
        self.refunds.append(tokens)

    async def resume(self, gen: Generation, err: Exception) -> WorkerMessage:
        self.resumed_from = (gen.replica, list(gen.sent))
        return gen.adopt(started(self, "r2", self.then, fail=False))


def started(owner: Owner, replica: str, msgs: list[WorkerMessage], fail: bool) -> Started:
    ticket = owner.loads.begin("m", replica, 3)
    return Started("m", Candidate("m", replica), msgs[0], Stream(msgs[1:], fail), ticket)


def make(owner: Owner, replica: str, msgs: list[WorkerMessage], fail: bool) -> Generation:
    run = started(owner, replica, msgs, fail)
    gen = Generation("m", replica, "router", 0, len(PROMPT), run.first, run, owner,
                     telemetry.RequestInfo(model="m"))
    gen.request = RouteRequest("m", PROMPT, SamplingParams(max_tokens=6), "req", {}, None)
    return gen


async def drain(gen: Generation) -> list[WorkerMessage]:
    return [m async for m in gen.messages()]


def test_a_cut_stream_resumes_and_reports_whole_usage() -> None:
    final = Final("r2", Usage(6, 3, 5), "length")
    owner = Owner(max_resumes=1, then=[Chunk("r2", "d", (4,)), Chunk("r2", "ef", (5, 6)),
                                       final])
    gen = make(owner, "r1", [Chunk("r1", "a", (1,)), Chunk("r1", "bc", (2, 3))], fail=True)
    msgs = asyncio.run(drain(gen))
    assert owner.resumed_from == ("r1", [1, 2, 3])  # only tokens whose text went out
    assert "".join(m.text for m in msgs if isinstance(m, Chunk)) == "abcdef"
    assert gen.replica == "r2" and gen.sent == [1, 2, 3, 4, 5, 6]
    assert isinstance(msgs[-1], Final) and msgs[-1].usage == Usage(3, 6, 3)
    assert owner.finals == [msgs[-1]]
    assert owner.loads.get("m", "r1").ongoing == owner.loads.get("m", "r2").ongoing == 0


def test_the_first_token_of_each_replicas_stream_is_observed_once() -> None:
    """Prefill ends once per replica's stream: at r1's first chunk and at r2's after the
    resume, never at later chunks; the request's time to first token is r1's."""
    owner = Owner(max_resumes=1, then=[Chunk("r2", "c", (3,)), Chunk("r2", "d", (4,)),
                                       Final("r2", Usage(4, 2, 0), "stop")])
    gen = make(owner, "r1", [Chunk("r1", "a", (1,)), Chunk("r1", "b", (2,))], fail=True)
    first = []

    async def run() -> None:
        async for _ in gen.messages():
            first.append(gen._info.first_token_at)

    asyncio.run(run())
    assert owner.first_tokens == 2 and gen.sent == [1, 2, 3, 4]
    assert first[0] is not None and first == [first[0]] * 5


def test_without_resumes_left_the_failure_reaches_the_caller() -> None:
    owner = Owner(max_resumes=0, then=[])
    gen = make(owner, "r1", [Chunk("r1", "a", (1,))], fail=True)
    with pytest.raises(ConnectionError):
        asyncio.run(drain(gen))
    assert owner.resumed_from is None and gen._info.failed
    assert gen._run.stream.cancelled


def test_a_client_that_leaves_is_charged_for_what_was_generated() -> None:
    """Closed after 2 of at most 6 tokens: the worker request is cancelled, the load view
    is back to 0, and the 4 output tokens not generated go back to the key."""
    owner = Owner(max_resumes=0, then=[])
    gen = make(owner, "r1", [Chunk("r1", "a", (1,)), Chunk("r1", "b", (2,)),
                             Chunk("r1", "c", (3,))], fail=False)
    gen.api_key, gen.max_tokens = KEY, 6

    async def two_then_leave() -> None:
        it = gen.messages()
        await anext(it)
        await anext(it)
        await it.aclose()  # what the route does when the client disconnects

    asyncio.run(two_then_leave())
    assert gen._run.stream.cancelled
    assert owner.loads.get("m", "r1").ongoing == 0
    assert owner.refunds == [4]
    gen.close()  # closing twice changes nothing
    assert owner.refunds == [4]


def test_a_finished_generation_refunds_the_unused_budget() -> None:
    owner = Owner(max_resumes=0, then=[])
    gen = make(owner, "r1", [Chunk("r1", "a", (1,)), Final("r1", Usage(3, 1, 0), "stop")],
               fail=False)
    gen.api_key, gen.max_tokens = KEY, 6
    asyncio.run(drain(gen))
    assert owner.refunds == [5] and not gen._run.stream.cancelled
