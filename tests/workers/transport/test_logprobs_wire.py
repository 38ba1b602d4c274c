"""Logprobs on the loopback wire (``workers.transport.loopback_wire``): a chunk's
``LOGPROBS`` frame and the request's asks round-trip; a malformed one is a ``ValueError``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.protocol import (
    CHUNK,
    FRAME_HEADER,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
    WorkRequest,
    parse_chunk,
)
from workers.transport.loopback_wire import (
    LOGPROBS,
    chunk_frames,
    frame,
    parse_logprobs,
    parse_request,
    request_frame,
)

_lp = st.floats(max_value=0.0, allow_nan=False)
_top = st.builds(TopLogprob, st.integers(0, 2**31), st.text(max_size=4), _lp)
_entry = st.builds(TokenLogprob, st.integers(0, 2**31), st.text(max_size=4), _lp,
                   st.integers(1, 5000), st.lists(_top, max_size=4).map(tuple))


@given(st.text(max_size=20), st.lists(_entry, max_size=4), st.lists(_entry, max_size=3))
def test_chunk_with_logprobs_round_trips(text: str, lps: list[TokenLogprob],
                                         prompt: list[TokenLogprob]) -> None:
    ids = tuple(x.token_id for x in lps)
    data = chunk_frames(text, ids, tuple(lps), tuple(prompt))
    kind, length = FRAME_HEADER.unpack_from(data)
    assert len(data) == FRAME_HEADER.size + length
    payload = memoryview(data)[FRAME_HEADER.size:]
    if not lps and not prompt:  # nothing to carry: the plain chunk frame
        assert kind == CHUNK and parse_chunk(payload) == (text, ids)
        return
    assert kind == LOGPROBS
    body, got, got_prompt = parse_logprobs(payload)
    assert parse_chunk(body) == (text, ids)
    assert (got, got_prompt) == (tuple(lps), tuple(prompt))


@pytest.mark.parametrize("bad", [
    [[[1, "a", 0.5, 1, []]], []],  # a logprob above 0
    [[[1, "a", float("nan"), 1, []]], []],
    [[[1, 2, -0.5, 1, []]], []],  # a token that is no string
    [[[1, "a", -0.5, 1, [[2, "b"]]]], []],  # a top entry short of its logprob
    [[]],  # one list, not two
])
def test_a_bad_logprobs_frame_is_a_value_error(bad: object) -> None:
    body = json.dumps(bad).encode()
    data = frame(LOGPROBS, len(body).to_bytes(4, "little") + body
                 + (0).to_bytes(4, "little"))
    with pytest.raises(ValueError):
        parse_logprobs(memoryview(data)[FRAME_HEADER.size:])


def test_request_carries_the_logprobs_asks() -> None:
    work = WorkRequest("r", [5, 6], SamplingParams(max_tokens=3, logprobs=5, prompt_logprobs=0))
    data = request_frame(work)
    got = parse_request(data[FRAME_HEADER.size:])
    assert (got.sampling.logprobs, got.sampling.prompt_logprobs) == (5, 0)
    plain = parse_request(request_frame(WorkRequest("r", [5], SamplingParams()))[
        FRAME_HEADER.size:])
    assert (plain.sampling.logprobs, plain.sampling.prompt_logprobs) == (None, None)
