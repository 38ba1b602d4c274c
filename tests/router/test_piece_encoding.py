"""Pieces to ids: small batches on the calling thread, large ones in the library's pool;
the ids are the same either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from router.piece_encoding import INLINE_CHARS, encode_pieces


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


def test_small_batches_stay_on_the_calling_thread_large_ones_go_to_the_pool(
        tiny_model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    small = ["<|im_start|>user\nhello ünïcödé<|im_end|>\n", "", " 12 34"]
    large = [*small, "word " * (INLINE_CHARS // 5 + 1)]
    for pieces, via in ((small, {"encode"}), (large, {"batch"})):
        rec = Recording(tok)
        got = encode_pieces(rec, pieces)  # type: ignore[arg-type]
        assert set(rec.calls) == via
        assert got == [tok.encode(p, add_special_tokens=False).ids for p in pieces]
