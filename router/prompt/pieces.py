"""How text pieces become token ids: a small batch on an event loop's own thread, anything
else in the ``tokenizers`` library's thread pool.

``Tokenizer.encode_batch_fast`` hands its batch to that (rayon) pool and waits, even for
one short piece. When a cold long prompt's encode holds the pool, a short prompt encoded
inline on the event loop waited for it: 19 ms, with every stream on the router
(found with a loop-lag probe). So on a thread that runs an event loop, a batch below
``INLINE_CHARS`` is encoded piece by piece right there (``Tokenizer.encode``, the
reference the prompt cache's property tests compare with: the ids are the same). The
tokenize pool's threads keep the batch call: no offsets computed, pieces in parallel."""

from __future__ import annotations

import asyncio

from tokenizers import Tokenizer

__all__ = ["INLINE_CHARS", "encode_pieces"]

# Below this much text (~2k tokens, ~3 ms cold) a conversation is encoded on the event loop
# (``ChatTokenizer.encode_chat``), and its pieces on the loop's thread.
INLINE_CHARS = 8192


def encode_pieces(tok: Tokenizer, pieces: list[str]) -> list[list[int]]:
    """Each piece's ids, special tokens in the text extracted, none added."""
    if sum(map(len, pieces)) < INLINE_CHARS and _on_event_loop():
        return [tok.encode(p, add_special_tokens=False).ids for p in pieces]
    return [e.ids for e in tok.encode_batch_fast(pieces, add_special_tokens=False)]


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
