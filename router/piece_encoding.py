"""How text pieces become token ids: small batches on the calling thread, large ones in
the ``tokenizers`` library's own thread pool.

``Tokenizer.encode_batch_fast`` hands its batch to that (rayon) pool and waits, even for
one short piece. When a cold long prompt's encode holds the pool, a short prompt encoded
inline on the event loop waited for it: 19 ms, with every stream on the router
(session 13's loop-lag probe). Below ``INLINE_CHARS`` the pieces are encoded one by one
on the caller's thread instead; the ids are the same (``encode`` is the reference the
prompt cache's property tests compare with)."""

from __future__ import annotations

from tokenizers import Tokenizer

__all__ = ["INLINE_CHARS", "encode_pieces"]

# Below this much text (~2k tokens, ~3 ms cold) an encode runs on the calling thread, and a
# conversation is encoded on the event loop (``ChatTokenizer.encode_chat``).
INLINE_CHARS = 8192


def encode_pieces(tok: Tokenizer, pieces: list[str]) -> list[list[int]]:
    """Each piece's ids, special tokens in the text extracted, none added."""
    if sum(map(len, pieces)) < INLINE_CHARS:
        return [tok.encode(p, add_special_tokens=False).ids for p in pieces]
    return [e.ids for e in tok.encode_batch_fast(pieces, add_special_tokens=False)]
