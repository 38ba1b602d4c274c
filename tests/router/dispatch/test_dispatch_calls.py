"""The Dispatcher's loopback calls (``router.start_transport: loopback``) against a real
``LoopbackServer`` on 127.0.0.1 with a fake replica, and fake Serve handles: a Handoff
teaches the replica's address, later requests to it skip the handle; a busy or
unreachable replica sends the request through Serve; an engine error before the first
message is retried on the next replica. (On real Serve: test_loopback.py.)"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

from router import telemetry
from router.dispatch.dispatch import Dispatcher
from router.dispatch.loopback_call import LoopbackCall
from router.dispatch.loopback_stream import Loopback
from router.routing.context import Candidate
from router.routing.decision import Decider
from router.routing.load import LoadTracker
from router.routing.pipeline import PipelineConfig
from tests.router.dispatch.test_dispatch import WORK, FakeHandle, ctx
from tests.router.dispatch.test_loopback_call import TOKEN, Replica
from workers.protocol import Chunk, Handoff
from workers.transport.loopback import LoopbackServer


def dispatcher(handle: FakeHandle, calls: bool = True) -> tuple[Dispatcher, LoadTracker]:
    loads = LoadTracker()
    decider = Decider(PipelineConfig(), loads, block_size=64, prior_prefill_tok_s=4000.0)
    d = Dispatcher({"m": handle}, decider, max_retries=2, first_token_timeout_s=5.0,
                   record_routed=lambda m, r, h: None, remember=lambda m, r: None,
                   loopback=Loopback("node-1", TOKEN),
                   call_models=frozenset({"m"}) if calls else frozenset())
    return d, loads


@contextlib.asynccontextmanager
async def learned(replica: Replica, calls: bool = True
                  ) -> AsyncIterator[tuple[Dispatcher, LoadTracker, FakeHandle]]:
    """A dispatcher that has learned the address of ``replica``'s (served) socket."""
    server = LoopbackServer(TOKEN, calls=replica)
    await server.start()
    try:
        handle = FakeHandle({})
        d, loads = dispatcher(handle, calls)
        await learn(d, handle, server)
        yield d, loads, handle
    finally:
        await server.stop()


async def dispatch(d: Dispatcher, *replicas: str) -> object:
    cands = [Candidate("m", r) for r in replicas]
    return await d.dispatch(cands, ctx(cands), WORK, telemetry.RequestInfo())


async def learn(d: Dispatcher, handle: FakeHandle, server: LoopbackServer) -> None:
    """One request through Serve whose replica hands off: the router learns its address."""
    handle.firsts["r1"] = Handoff("r1", Chunk("r1", "h", (5,)), server.address or "",
                                  server.open())
    started = await dispatch(d, "r1")
    started.stream.cancel()  # type: ignore[attr-defined]
    d.loads.end(started.ticket)  # type: ignore[attr-defined]  # as Generation.close does
    handle.firsts.pop("r1")


async def test_after_a_handoff_the_next_request_is_a_loopback_call() -> None:
    replica = Replica(["a", "b"])
    async with learned(replica) as (d, loads, handle):
        assert len(handle.calls) == 1 and replica.seen == []
        started = await dispatch(d, "r1", "r2")
        assert len(handle.calls) == 1  # Serve's handle not called again
        assert isinstance(started.stream, LoopbackCall)  # type: ignore[attr-defined]
        assert replica.seen == [dataclasses.replace(WORK, trace=replica.seen[0].trace)]
        assert started.first.text.startswith("a")  # type: ignore[attr-defined]
        assert loads.get("m", "r1").ongoing == 1
        started.stream.cancel()  # type: ignore[attr-defined]


async def test_a_model_without_calls_always_starts_through_serve() -> None:
    replica = Replica(["a"])
    async with learned(replica, calls=False) as (d, _, handle):
        await dispatch(d, "r1")
        assert len(handle.calls) == 2 and replica.seen == []


async def test_a_busy_replica_sends_the_request_through_serve() -> None:
    replica = Replica(["a"], slots=0)
    async with learned(replica) as (d, loads, handle):
        started = await dispatch(d, "r1", "r2")
        assert handle.calls[-1] == ["r1", "r2"] and replica.seen == []
        assert not isinstance(started.stream, LoopbackCall)  # type: ignore[attr-defined]
        assert loads.get("m", "r1").ongoing == 1  # one ticket: the call's became Serve's


async def test_an_unreachable_replica_is_forgotten_and_served_through_serve() -> None:
    replica = Replica(["a"])
    server = LoopbackServer(TOKEN, calls=replica)
    await server.start()
    handle = FakeHandle({})
    d, _ = dispatcher(handle)
    await learn(d, handle, server)
    await server.stop()  # the replica's socket is gone
    await dispatch(d, "r1")
    assert len(handle.calls) == 2
    assert d._addresses == {}  # the next request does not try the socket again


async def test_an_engine_error_before_the_first_message_is_retried_on_the_next() -> None:
    replica = Replica(["a"], fail_after=0)
    async with learned(replica) as (d, loads, handle):
        started = await dispatch(d, "r1", "r2")
        assert started.target.replica == "r2"  # type: ignore[attr-defined]
        assert handle.calls[-1] == ["r2"] and len(replica.seen) == 1
        assert loads.get("m", "r1").ongoing == 0


async def test_forget_drops_the_addresses_of_replicas_serve_dropped() -> None:
    replica = Replica(["a"])
    async with learned(replica) as (d, _, handle):
        d.forget({"r1"})
        assert set(d._addresses) == {"r1"}
        d.forget(set())
        assert d._addresses == {}


async def test_a_refused_call_is_served_through_serve_and_its_address_forgotten() -> None:
    replica = Replica(["a"], replica="r9")  # the address now belongs to another replica
    async with learned(replica) as (d, loads, handle):
        started = await dispatch(d, "r1")
        assert len(handle.calls) == 2 and replica.seen == []
        assert not isinstance(started.stream, LoopbackCall)  # type: ignore[attr-defined]
        assert d._addresses == {} and loads.get("m", "r1").ongoing == 1
