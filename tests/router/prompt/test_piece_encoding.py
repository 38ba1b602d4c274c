"""Pieces to ids: a small batch on an event loop's thread is encoded right there, anything
else in the library's pool; the ids are the same either way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from router.prompt.pieces import INLINE_CHARS, encode_pieces


class Recording:
    """A tokenizer that notes which call encoded (a fake: only the dispatch is tested)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.calls = tok, []

    def encode(self, text: str, add_special_tokens: bool) -> Any:
        self.calls.append("encode")
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
        self.calls.append("batch")
        return self.tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


def test_only_a_small_batch_on_a_loop_stays_on_its_thread(tiny_model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    small = ["<|im_start|>user\nhello ünïcödé<|im_end|>\n", "", " 12 34"]
    large = [*small, "word " * (INLINE_CHARS // 5 + 1)]

    async def on_loop(pieces: list[str]) -> tuple[list[list[int]], list[str]]:
        rec = Recording(tok)
        return encode_pieces(rec, pieces), rec.calls  # type: ignore[arg-type]

    def off_loop(pieces: list[str]) -> tuple[list[list[int]], list[str]]:
        rec = Recording(tok)
        return encode_pieces(rec, pieces), rec.calls  # type: ignore[arg-type]

    for pieces, where, via in ((small, "loop", {"encode"}), (large, "loop", {"batch"}),
                               (small, "pool", {"batch"})):
        got, calls = asyncio.run(on_loop(pieces)) if where == "loop" else off_loop(pieces)
        assert set(calls) == via, (where, len(pieces))
        assert got == [tok.encode(p, add_special_tokens=False).ids for p in pieces]
