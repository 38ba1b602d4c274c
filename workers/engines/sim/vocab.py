"""The emulator's output vocabulary: whole-word tokens of the model's own tokenizer, so the
text a client receives tokenizes back to the ids the emulator counted (a client's own token
count, as aiperf and inference-perf make by default, equals the server's), and the next turn's
prompt holds the reply as the same ids.

A token qualifies if it decodes to a space and letters and that text encodes back to it
alone; a space-led word never merges with the one before it, so a run of them round-trips
token for token. Without a tokenizer beside the model (a sim with no real model folder) the
emulator keeps its one-word-per-id text, ``" w<id>"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WORD = re.compile(r" [A-Za-z]{2,12}")
MIN_WORDS = 16  # fewer: the tokenizer is not one this works for


@dataclass(frozen=True, slots=True)
class SimVocab:
    ids: tuple[int, ...]  # the tokens the emulator emits
    texts: dict[int, str]  # and their text
    # the model's tokenizer (``tokenizers.Tokenizer``): structured replies are spelled with it
    tokenizer: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def of_model(cls, model_path: str) -> SimVocab | None:
        """From ``tokenizer.json`` in ``model_path``; None without one."""
        path = Path(model_path) / "tokenizer.json"
        if not path.is_file():
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        size = tok.get_vocab_size(with_added_tokens=False)
        texts = [tok.decode([i], skip_special_tokens=True) for i in range(size)]
        words = [i for i, t in enumerate(texts) if _WORD.fullmatch(t)]
        encoded = tok.encode_batch_fast([texts[i] for i in words], add_special_tokens=False)
        ids = tuple(i for i, enc in zip(words, encoded, strict=True) if enc.ids == [i])
        return cls(ids, {i: texts[i] for i in ids}, tok) if len(ids) >= MIN_WORDS else None

    def text(self, token_id: int) -> str:
        return self.texts[token_id]
