"""The sampling controls on the loopback call's wire: every control round-trips, a header
without them means all off, and a bad value is a ``ValueError``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from workers.protocol import FRAME_HEADER, SamplingParams, WorkRequest
from workers.transport.loopback_wire import REQUEST, parse_request, request_frame
from workers.transport.sampling_wire import CONTROLS, controls, with_controls

ALL_ON = SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, stop=("x",), seed=4,
                        ignore_eos=True, top_k=5, min_p=0.1, presence_penalty=-0.5,
                        frequency_penalty=1.5, repetition_penalty=1.2,
                        logit_bias=((3, 100.0), (7, -2.5)), min_tokens=3,
                        stop_token_ids=(2, 9), bad_words=("foo", "bar baz"))


def _payload(frame: bytes) -> bytes:
    kind, n = FRAME_HEADER.unpack_from(frame)
    assert kind == REQUEST and len(frame) == FRAME_HEADER.size + n
    return frame[FRAME_HEADER.size:]


@pytest.mark.parametrize("sampling", [ALL_ON, SamplingParams(), replace(ALL_ON, top_k=0)])
def test_every_control_round_trips(sampling: SamplingParams) -> None:
    work = WorkRequest("r", [1, 2, 3], sampling)
    assert parse_request(_payload(request_frame(work))).sampling == sampling


def test_all_off_sends_no_controls() -> None:
    assert controls(SamplingParams(max_tokens=3)) is None
    assert len(controls(ALL_ON) or []) == len(CONTROLS)


@pytest.mark.parametrize("bad", [
    [1.5, 0, 0, 0, 1, [], 0, [], []],  # top_k not an int
    [0, float("nan"), 0, 0, 1, [], 0, [], []],
    [0, 0, 0, 0, 1, [[1]], 0, [], []],  # a bias pair of one
    [0, 0, 0, 0, 1, [["a", 1.0]], 0, [], []],
    [0, 0, 0, 0, 1, [], True, [], []],  # min_tokens a bool
    [0, 0, 0, 0, 1, [], 0, ["2"], []],
    [0, 0, 0, 0, 1, [], 0, [], [3]],
    [0, 0, 0, 0, 1, [], 0, []],  # one short
    {"top_k": 1},
])
def test_a_bad_control_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        with_controls(SamplingParams(), json.loads(json.dumps(bad)))
