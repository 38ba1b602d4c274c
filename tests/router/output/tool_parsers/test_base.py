"""``MarkerParser``'s plain-text fast path (a chunk where no marker can start skips the
marker searches) gives exactly the events of its general step, for every marker family,
whatever the chunking."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.output.text_stream import Buffered
from router.output.tool_parsers import FAMILIES
from router.output.tool_parsers.base import Event, Family, MarkerParser
from tests.router.output.tool_parsers.helpers import pieces

MARKER_FAMILIES = [f for f in FAMILIES.values() if f.factory is None]


class GeneralOnly(MarkerParser):
    feed = Buffered.feed  # every chunk through ``_step``, as before the fast path


def chunks_of(family: Family, rng: random.Random) -> list[str]:
    """Words, whitespace, markers and calls of ``family``, plain-text-heavy like a reply."""
    call = '{"name": "f", "arguments": {"a": 1}}'
    parts = [" w12", "  ", "\n", "é", "<", "[", "{", "a < b", call, family.start,
             family.end or "", *(s for pair in family.unwrapped for s in pair)]
    weights = [30, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, *(1 for _ in family.unwrapped for _ in "ab")]
    return pieces("".join(rng.choices(parts, weights, k=rng.randint(0, 40))), rng)


def run(parser: MarkerParser, chunks: list[str]) -> list[list[Event]]:
    return [parser.feed(c) for c in chunks] + [parser.flush()]


@pytest.mark.parametrize("family", MARKER_FAMILIES, ids=lambda f: f.name)
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_fast_path_gives_the_general_steps_events(family: Family, seed: int) -> None:
    chunks = chunks_of(family, random.Random(seed))
    fast = run(MarkerParser(family, {}), chunks)
    assert fast == run(GeneralOnly(family, {}), chunks)  # chunk by chunk, same events


def test_plain_chunks_stream_as_they_come_and_trailing_space_waits() -> None:
    p = FAMILIES["hermes"].parser()
    assert p.feed(" w1") == [" w1"]
    assert p.feed(" w2 ") == [" w2"]
    assert p.feed("\n<tool_call>") == []  # the held space is dropped before a call
