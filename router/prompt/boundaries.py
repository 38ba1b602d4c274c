"""Which added tokens of a tokenizer are exact cut points for the prompt cache: the rules
and their proof are in ``router.prompt.cache``'s docstring (rules 2-4 checked statically
here, then a probe encodes tricky continuations both ways)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer

__all__ = ["boundary_tokens"]

_PIECE_LOCAL = {
    "normalizer": {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents",
                   "Replace", "Prepend", "Sequence", "BertNormalizer", "Nmt", "Precompiled",
                   "ByteLevel"},
    "pre_tokenizer": {"ByteLevel", "Split", "Sequence", "Digits", "Punctuation", "Whitespace",
                      "WhitespaceSplit", "BertPreTokenizer", "Metaspace", "UnicodeScripts",
                      "CharDelimiterSplit"},
    "model": {"BPE", "WordPiece", "WordLevel", "Unigram"},
}
_PROBES = ("", " a", "  x", "\n", "\n\nfoo bar", "hello", "Hello world", "123 45", "\u0301e",
           "é", "\t\t", " ", "'s", "<|", "日本語", "\U0001F600 ok")


# -- which added tokens are boundaries ----------------------------------------------------
def _pipeline_ok(config: dict[str, Any]) -> bool:
    """Rule 4: every stage after the added-token split works on each piece alone."""
    if config.get("truncation") or config.get("padding"):
        return False
    for stage in ("normalizer", "pre_tokenizer", "model"):
        if not _stage_ok(stage, config.get(stage)):
            return False
    return not config["model"].get("dropout")


def _stage_ok(stage: str, spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return stage != "model"
    kind = spec.get("type")
    if stage == "model" and kind is None:  # older files name the model by its fields
        kind = "BPE" if "merges" in spec else None
    if kind not in _PIECE_LOCAL[stage]:
        return False
    if kind == "Metaspace" and spec.get("prepend_scheme", "always") == "first":
        return False
    inner = spec.get("normalizers") or spec.get("pretokenizers") or []
    return all(_stage_ok(stage, s) for s in inner)


def _has_border(t: str) -> bool:
    return any(t[:k] == t[-k:] for k in range(1, len(t)))


def _static_ok(t: dict[str, Any], others: Iterable[str]) -> bool:
    """Rules 2 and 3 for the added token ``t`` against all other added tokens."""
    text = t["content"]
    if (not text or t.get("rstrip") or t.get("single_word") or t.get("normalized")
            or _has_border(text) or text[-1].isspace() or re.match(r"\w", text[-1])):
        return False
    for s in others:
        if s == text:
            continue
        if text in s:
            return False
        for k in range(1, len(text)):
            if (len(s) > k and s.endswith(text[:k])) or (len(s) > k and s.startswith(text[-k:])):
                return False
    return True


def _probe_ok(tok: Tokenizer, t: str) -> bool:
    def ids(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    for a in ("", "abc ", "x\n", t):
        for b in (*_PROBES, t, t + " z"):
            if ids(a + t + b) != ids(a + t) + ids(b):
                return False
    return True


def boundary_tokens(tok: Tokenizer, rendered: Sequence[str]) -> tuple[str, ...]:
    """The added tokens that are exact cut points (module docstring) and that the template
    emits in the ``rendered`` probe conversations."""
    config = json.loads(tok.to_str())
    if tok.encode_special_tokens or not _pipeline_ok(config):
        return ()
    added = config.get("added_tokens") or []
    contents = [a["content"] for a in added]
    found = []
    for a in added:
        text = a["content"]
        if (any(text in r for r in rendered) and _static_ok(a, contents)
                and _probe_ok(tok, text)):
            found.append(text)
    return tuple(sorted(found))
