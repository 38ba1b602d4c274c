"""``take_ready``: what a stream sends in one message is exactly what was queued, in
order, consecutive chunks merged, and nothing it would have to wait for."""

from __future__ import annotations

import asyncio

from workers.protocol import Finished, TokenChunk, Usage, take_ready

END = Finished(Usage(3, 3, 0), "stop")


def _queue(*items: object) -> asyncio.Queue:  # type: ignore[type-arg]
    q: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
    for item in items:
        q.put_nowait(item)
    return q


def test_a_lone_token_goes_alone() -> None:
    first = TokenChunk("a", (1,))
    assert take_ready(first, _queue()) == [first]


def test_ready_chunks_merge_and_the_end_follows() -> None:
    q = _queue(TokenChunk("é", (2,)), TokenChunk("", (3,)), END)
    assert take_ready(TokenChunk("a", (1,)), q) == [TokenChunk("aé", (1, 2, 3)), END]
    assert q.empty()


def test_other_items_keep_their_place() -> None:
    err = ValueError("bad")
    q = _queue(TokenChunk("b", (2,)), err, TokenChunk("c", (3,)))
    assert take_ready(TokenChunk("a", (1,)), q) == [TokenChunk("ab", (1, 2)), err,
                                                      TokenChunk("c", (3,))]
