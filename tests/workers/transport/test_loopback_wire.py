"""The loopback call's frames (``workers.transport.loopback_wire``): every record round-trips, and
a malformed request is a ``ValueError`` (never a crash, never a wrong request)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from array import array

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_service.events import AllBlocksCleared, BlockRemoved, BlockStored
from cache_service.hashing import U32Ids, token_bytes
from workers.protocol import (
    CONSTRAINT_KINDS,
    FRAME_HEADER,
    Constraint,
    Final,
    Rejected,
    SamplingParams,
    Usage,
    WorkRequest,
    token_array,
)
from workers.transport.loopback_wire import (
    FINAL,
    IDS_STEP,
    REJECTED,
    REQUEST,
    final_frame,
    ids_in_steps,
    ids_part,
    parse_final,
    parse_rejected,
    parse_request,
    rejected_frame,
    request_frame,
    send,
)

ids = st.lists(st.integers(0, 2**32 - 1), max_size=300)
texts = st.text(max_size=40)
constraints = st.none() | st.builds(Constraint, st.sampled_from(CONSTRAINT_KINDS), texts,
                                    st.lists(texts, max_size=3).map(tuple))


def payload(frame: bytes, kind: int) -> bytes:
    k, n = FRAME_HEADER.unpack_from(frame)
    assert k == kind and n == len(frame) - FRAME_HEADER.size
    return frame[FRAME_HEADER.size:]


@given(rid=texts, token_ids=ids, mt=st.integers(1, 1 << 20),
       temp=st.floats(0, 2), top_p=st.floats(0, 1), stop=st.lists(texts, max_size=4),
       seed=st.none() | st.integers(-(2**63), 2**63 - 1), ignore_eos=st.booleans(),
       trace=st.none() | st.dictionaries(texts, texts, max_size=3),
       salt=st.none() | texts, lease=st.floats(0, 1e6), background=st.booleans(),
       constraint=constraints)
def test_a_request_round_trips(rid: str, token_ids: list[int], mt: int, temp: float,
                               top_p: float, stop: list[str], seed: int | None,
                               ignore_eos: bool, trace: dict[str, str] | None,
                               salt: str | None, lease: float, background: bool,
                               constraint: Constraint | None) -> None:
    work = WorkRequest(rid, token_ids, SamplingParams(mt, temp, top_p, tuple(stop), seed,
                                                      ignore_eos, constraint),
                       trace, salt, lease, None, background)
    got = parse_request(payload(request_frame(work), REQUEST))
    assert got == work
    assert got.token_ids.u32 == token_bytes(token_ids)  # what the engine's hashes slice


def test_a_long_prompts_ids_are_parsed_in_steps_and_carry_their_bytes() -> None:
    token_ids = [(i * 2654435761) % 2**32 for i in range(3 * IDS_STEP + 5)]
    sent = TokenIdsLike(token_ids)
    sent.u32 = token_bytes(token_ids)  # the router's ids go out as their bytes
    work = WorkRequest("r", sent, SamplingParams(max_tokens=1))
    body = payload(request_frame(work), REQUEST)
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def scenario() -> WorkRequest:
        ticker = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        try:
            return parse_request(body, await ids_in_steps(ids_part(body)))
        finally:
            ticker.cancel()

    got = asyncio.run(scenario())
    assert got == parse_request(body) and got.token_ids == token_ids
    assert type(got.token_ids) is U32Ids and got.token_ids.u32 == token_bytes(token_ids)
    assert turns >= 4  # the loop ran other tasks between the 4 steps


class TokenIdsLike(U32Ids):
    """The router's ``TokenIds``: its ``u32`` is what goes on the wire."""


def _head(**over: object) -> bytes:
    head = {"request_id": "r", "trace": None, "cache_salt": None, "lease_s": 0.0,
            "background": False, "sampling": [8, 0.0, 1.0, [], None, False], **over}
    raw = json.dumps(head).encode()
    return len(raw).to_bytes(4, "little") + raw + (7).to_bytes(4, "little")


@pytest.mark.parametrize("raw", [
    b"",
    b"\xff\xff\xff\x00{}",  # a header longer than the payload
    _head()[:-1],  # token ids not a whole number of u32
    (2).to_bytes(4, "little") + b"[]",  # a header that is not an object
    _head(request_id=5),
    _head(sampling=[8, 0.0, 1.0, []]),
    _head(sampling=["8", 0.0, 1.0, [], None, False]),
    _head(sampling=[True, 0.0, 1.0, [], None, False]),  # a bool is no token count
    _head(sampling=[8, 0.0, 1.0, [1], None, False]),
    _head(sampling=[8, 0.0, 1.0, [], None, 1]),
    _head(trace={"a": 1}),
    _head(cache_salt=3),
    _head(lease_s="1"),
    _head(background="no"),
    len(b"{").to_bytes(4, "little") + b"{",  # not JSON
    _head(sampling=[0, 0.0, 1.0, [], None, False]),  # no token to generate
    _head(sampling=[8, float("nan"), 1.0, [], None, False]),
    _head(sampling=[8, 0.0, float("inf"), [], None, False]),
    _head(lease_s=-1.0),
    _head(constraint=["json"]),
    _head(constraint=["bogus", "", []]),  # not a kind of constraint
    _head(constraint=["regex", 5, []]),
    _head(constraint=["choice", "", [1]]),
    _head(constraint={"kind": "json"}),
])
def test_a_malformed_request_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(raw)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6),
       st.integers(0, 10**6), st.sampled_from(["stop", "length", "abort"]),
       st.none() | texts, st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_a_final_round_trips(p: int, c: int, cached: int, host: int, reason: str,
                             stop: str | None, hashes: list[int]) -> None:
    events = (BlockStored("m", "r1", tuple(hashes), "host"),
              BlockRemoved("m", "r1", tuple(hashes[:3])), AllBlocksCleared("m", "r1"))
    final = Final("r1", Usage(p, c, cached, host), reason, stop, events)
    assert parse_final(payload(final_frame(final), FINAL)) == final


@given(texts, st.sampled_from([400, 413, 422]))
def test_a_rejection_round_trips(message: str, status: int) -> None:
    msg = Rejected("r1", message, status)
    assert parse_rejected(payload(rejected_frame(msg), REJECTED)) == msg


def test_send_to_a_router_that_left_is_a_connection_reset() -> None:
    """Under uvloop (Serve's loop) a write to a closed handle raised ``RuntimeError``,
    which the call's pump took for an engine failure; ``send`` makes it a reset."""

    async def scenario() -> None:
        accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()
        server = await asyncio.start_server(lambda _, w: accepted.put_nowait(w),
                                            "127.0.0.1", 0)
        try:
            _, router = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            writer = await accepted.get()
            await send(writer, b"frame")  # the router is there
            sock = router.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            router.transport.abort()  # the router died: a reset
            for _ in range(200):
                if writer.is_closing():
                    break
                await asyncio.sleep(0.01)
            assert writer.is_closing()
            with pytest.raises(RuntimeError):  # why send checks first
                writer.write(b"frame")
            with pytest.raises(ConnectionResetError):
                await send(writer, b"frame")
        finally:
            server.close()

    uvloop.run(scenario())


class _Ids(list[int]):
    """A list subclass, as the router's ``TokenIds`` (which ``array()`` reads item by item)."""


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1), max_size=300), n=st.integers(0, 400))
def test_token_array_is_the_array_constructor(ids: list[int], n: int) -> None:
    for given_ids in (ids[:n], _Ids(ids[:n])):
        got = token_array(given_ids)
        assert got == array("I", ids[:n]) and got.typecode == "I"
