"""Special-token strings in client text are text, never control tokens.

A chat prompt is the template's rendering of client strings (message contents, tool
results, tool definitions, names, the system text, an assistant prefill). Tokenizing that
whole text with added-token extraction would turn a user's ``<|im_end|>\\n<|im_start|>system``
into the template's own turn markers: the client could forge turns and roles. Only the
special tokens the *template* placed may become special ids; the client's are encoded as
ordinary text, as ``tokenizers`` does with ``encode_special_tokens=True`` (transformers'
``split_special_tokens=True``). Non-special added tokens (``<tool_call>``, ``<think>``)
are vocabulary words, extracted in client text exactly as before, as HF does too.

How (one exact way):

1. Fast path. The client strings are serialized at C speed (``marshal``) and scanned once
   for any special-token string (and for ``ESC``, below). None found, the common case:
   render and tokenize exactly as before (``in_client``; ~0.2 ms at 160k tokens).
2. Otherwise each occurrence in a client string is replaced by a two-character *marker*,
   ``ESC`` (U+F0000, private use) plus one private-use character per special token, and a
   literal ``ESC`` by its own marker, so the escaping is reversible and the client cannot
   forge a marker either (``escape_chat``). The template renders the marked strings: in the
   marked text every special-token string left is one the template wrote.
3. Tokenization of marked text (``encode``): ``tokenizers`` extracts added tokens first
   and encodes the pieces between them each on its own; we do the same split with a
   leftmost-longest regex over all added tokens, emit their ids, and encode each piece
   with its markers put back with a second tokenizer whose ``encode_special_tokens`` is
   on. A piece without a marker is encoded by the ordinary tokenizer, so a marked text
   differs from the unmarked one only inside the pieces that hold client special strings.
   The prompt cache (``router.prompt.cache``) cuts marked text at the template's boundary
   tokens only (a marker is not one) and encodes its segments through ``encode``, so its
   results stay bit-identical to ``encode`` of the whole marked text.
4. The check. ``unescape(marked render) == plain render`` holds for templates that insert
   client strings (trimmed, sliced by other tokens, JSON-dumped) without testing them for
   special-token strings; the tokenizer probes it at load (``ChatTokenizer``) and tests do
   for the shipped templates. A template that does transform them (e.g. branches on
   ``'<|im_end|>' in content``) gets the conservative rule anyway: the prompt is the
   template's rendering of the marked strings, so its special ids are the template's own
   and every client special-token string is text; only that text may differ from the
   plain render. Logged once at load.

Limits: added tokens with ``lstrip``/``rstrip``/``single_word``/``normalized`` flags are
split at their plain strings in step 3 (the shipped tokenizers have none); a completions
prompt is raw text the client owns whole, so its special-token strings stay special, as
in vLLM and OpenAI's completions API.
"""

from __future__ import annotations

import json
import marshal
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from tokenizers import Tokenizer

from router.prompt.pieces import encode_pieces

__all__ = ["ESC", "ClientSpecials"]

ESC = "\U000F0000"
_ESC_BYTES = ESC.encode("utf-8")
_FIRST_MARK = 0xF0001  # private use planes 15 and 16 hold the markers' second character
_PLANE_16 = 0x100000


def _mark_char(i: int) -> str:
    code = _FIRST_MARK + i
    if code > 0xFFFFD:
        code = _PLANE_16 + (code - 0xFFFFE)
    if code > 0x10FFFD:
        raise ValueError("too many special tokens for private-use markers")
    return chr(code)


def _alternation(words: list[str]) -> re.Pattern[str]:
    # Longest first: at one position Python's alternation takes the first that matches,
    # which makes the scan leftmost-longest, as the tokenizer's added-token matcher is.
    return re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))


def _factored(words: list[bytes]) -> re.Pattern[bytes]:
    """A regex matching any of ``words``, their common prefix factored out: ``re`` then
    scans for that literal prefix (~10x faster than a plain alternation)."""
    prefix = os.path.commonprefix(words)
    rest = b"|".join(re.escape(w[len(prefix):]) for w in sorted(words, key=len, reverse=True))
    return re.compile(re.escape(prefix) + b"(?:" + rest + b")")


class ClientSpecials:
    """The escaping of client special-token strings and the tokenization of marked text."""

    def __init__(self, tok: Tokenizer) -> None:
        added = json.loads(tok.to_str()).get("added_tokens") or []
        self._tok = tok
        self.specials = [a["content"] for a in added if a.get("special")]
        self.active = bool(self.specials) and not tok.encode_special_tokens
        self._ids = {a["content"]: a["id"] for a in added}
        self._marks = {s: ESC + _mark_char(i) for i, s in enumerate(self.specials)}
        self._marks[ESC] = ESC + _mark_char(len(self.specials))
        self._unmarks = {m[1]: s for s, m in self._marks.items()}
        self._find = _alternation(list(self._marks))
        encoded = [s.encode("utf-8") for s in self.specials]
        self._encoded = tuple(encoded)
        self._first_bytes = sorted({s[:1] for s in encoded})
        self._search = _factored(encoded).search if encoded else None
        self._split = _alternation(list(self._ids)) if self._ids else None
        self._unmark = re.compile(re.escape(ESC) + "(.)", re.DOTALL)
        self._text_tok = Tokenizer.from_str(tok.to_str())
        self._text_tok.encode_special_tokens = True

    # -- client strings ---------------------------------------------------------------------
    def in_client(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  suffix: str = "", options: Any = None) -> bool:
        """Whether any client string holds a special-token string (or ``ESC``). Serialized
        by ``marshal`` (C, ~0.2 ms for 160k tokens) and scanned once: one ``memchr`` per
        first byte, the regex only when one is there. A match across two strings is a
        false positive, which costs time only: escaping then finds nothing to mark."""
        if not self.active:
            return False
        try:
            data = marshal.dumps((messages, tools, suffix, options))
        except ValueError:  # not plain JSON values (or nested too deep): walk them
            return any(self._find.search(v)
                       for v in _strings([messages, tools, suffix, options]))
        return self._found(data) or (_ESC_BYTES[:1] in data and _ESC_BYTES in data)

    def _found(self, data: bytes) -> bool:
        """A special token's bytes in ``data``: checked at each occurrence of a first byte
        (``find`` is a C ``memchr``), by the regex once there are many."""
        for b in self._first_bytes:
            pos, left = data.find(b), 64
            while pos >= 0:
                if data.startswith(self._encoded, pos):
                    return True
                left -= 1
                if not left:
                    return self._search is not None and self._search(data) is not None
                pos = data.find(b, pos + 1)
        return False

    def escape_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    suffix: str = ""
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
        """Copies with every special-token string (and ``ESC``) in client strings marked."""
        return _map(messages, self.escape), _map(tools, self.escape), self.escape(suffix)

    def escape(self, s: str) -> str:
        return self._find.sub(lambda m: self._marks[m.group()], s)

    def unescape(self, s: str) -> str:
        return self._unmark.sub(lambda m: self._unmarks.get(m.group(1), m.group()), s)

    # -- marked text ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """The ids of marked text: the added tokens in it as their ids, the client's
        special-token strings as text (module docstring, step 3)."""
        return self.encode_pieces([text])[0]

    def encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        """``encode`` of each piece; pieces without a marker in one ordinary batch."""
        out: list[list[int]] = [[] for _ in pieces]
        plain = [i for i, p in enumerate(pieces) if ESC not in p]
        if plain:
            batch = encode_pieces(self._tok, [pieces[i] for i in plain])
            for i, ids in zip(plain, batch, strict=True):
                out[i] = ids
        for i, piece in enumerate(pieces):
            if ESC in piece:
                out[i] = self._encode_marked(piece)
        return out

    def _encode_marked(self, text: str) -> list[int]:
        parts: list[str | int] = []
        pos = 0
        for m in self._split.finditer(text) if self._split else ():
            if m.start() > pos:
                parts.append(text[pos:m.start()])
            parts.append(self._ids[m.group()])
            pos = m.end()
        if pos < len(text):
            parts.append(text[pos:])
        texts = [p for p in parts if isinstance(p, str)]
        plain = [self.unescape(t) if ESC in t else t for t in texts]
        marked = [ESC in t for t in texts]
        ids_plain = encode_pieces(
            self._tok, [t for t, m in zip(plain, marked, strict=True) if not m])
        ids_text = encode_pieces(
            self._text_tok, [t for t, m in zip(plain, marked, strict=True) if m])
        plain_it, text_it = iter(ids_plain), iter(ids_text)
        out: list[int] = []
        flags = iter(marked)
        for p in parts:
            if isinstance(p, int):
                out.append(p)
            else:
                out.extend(next(text_it) if next(flags) else next(plain_it))
        return out


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value`` (keys included), without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)


def _map(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string in it (keys included)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {(fn(k) if isinstance(k, str) else k): _map(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map(v, fn) for v in value]
    return value
