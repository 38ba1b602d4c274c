"""Grammar-constrained decoding on mlx: a per-sequence logits processor over llguidance.

A request's ``Constraint`` (``workers.protocol``) becomes an llguidance grammar
(``grammar_spec``), a matcher is compiled for it when the request joins the batch
(``Grammars.processor``; a grammar llguidance refuses fails that request alone with a
400), and the matcher's token mask is applied to that sequence's logits at every step
inside mlx-lm's ``BatchGenerator`` (``GrammarProcessor``, one of the sequence's
``logits_processors``). Sequences without a constraint take no part in it.

Why llguidance (docs/structured-outputs.md has the figures and the command,
``kvroute bench micro grammar-cost``): on CPU MLX with the tiny model's tokenizer it
compiled a nested JSON schema in ~1-3 ms (outlines-core ~115-290 ms, xgrammar ~100 ms)
and computed a mask in ~65 µs per token on average (xgrammar ~35 µs, outlines-core
~225 µs), without torch (xgrammar needs it), in a Rust wheel for Linux and macOS; the
mask is applied with MLX ops, so the same code runs on CPU and on Metal.

JSON is kept compact (``", "`` and ``": "``, no free whitespace: a model cannot pad its
output forever), and once the grammar is complete only EOS is allowed, so a constrained
sequence ends where its grammar does (the batch loop keeps the EOS stop for it even
under ``ignore_eos``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from workers.engines.mlx.jobs import Job
from workers.protocol import Constraint, InputRejected

log = logging.getLogger(__name__)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(InputRejected):
    """A constraint the grammar library refuses: the caller's input (a 400)."""


def grammar_spec(c: Constraint) -> str:
    """The llguidance grammar of a constraint (its own JSON form)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    if c.kind in ("json", "json_object"):
        schema = c.text if c.kind == "json" else '{"type": "object"}'
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        except ValueError as e:
            raise GrammarError(f"json schema: {e}") from e
    if c.kind == "regex":
        return LLMatcher.grammar_from_regex(c.text)
    if c.kind == "choice":
        alts = " | ".join(json.dumps(x, ensure_ascii=False) for x in c.choices)
        return LLMatcher.grammar_from_lark(f"start: {alts}\n")
    text = gbnf_to_lark(c.text) if "::=" in c.text else c.text  # GBNF (llama.cpp, xgrammar)
    return LLMatcher.grammar_from_lark(text)


class GrammarProcessor:
    """One sequence's mask: called by mlx-lm with the sequence's tokens so far (the
    prompt, then each sampled token) and its logits; the first call marks where the
    prompt ends, each later call feeds the matcher the tokens sampled since."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        import numpy as np

        self._matcher, self._vocab = matcher, vocab
        self._seen: int | None = None
        self._bits = np.full((1, (vocab + 31) // 32), -1, dtype=np.int32)

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask

        n = int(tokens.size)
        if self._seen is not None and n > self._seen and not self._matcher.is_stopped():
            # the batch computes one step ahead: the EOS that ends the sequence comes back
            # here once more before it leaves the batch (a stopped matcher skips it)
            if not self._matcher.consume_tokens(tokens[self._seen:].tolist()):
                log.warning("mlx grammar: a sampled token broke the grammar: %s",
                            self._matcher.get_error())
        self._seen = n  # a complete (stopped) grammar's mask is EOS alone
        fill_next_token_bitmask(self._matcher, self._bits)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self._vocab]
        width = logits.shape[-1]
        if width > self._vocab:  # the model's padded rows: never allowed
            allowed = np.concatenate([allowed, np.zeros(width - self._vocab, np.uint8)])
        mask = mx.array(allowed[:width].astype(np.bool_))
        return mx.where(mask, logits, mx.array(-float("inf"), dtype=logits.dtype))


class Grammars:
    """The engine thread's llguidance tokenizer (built on the first constrained request)
    and the processors it compiles."""

    def __init__(self, hf_tokenizer: Any, eos_ids: list[int]) -> None:
        self._hf, self._eos = hf_tokenizer, eos_ids
        self._tok: Any = None
        self.vocab = 0

    def _tokenizer(self) -> Any:
        if self._tok is None:
            from llguidance.hf import from_tokenizer

            self.vocab = len(self._hf)
            self._tok = from_tokenizer(self._hf, n_vocab=self.vocab, eos_token=self._eos)
        return self._tok

    def processor(self, c: Constraint) -> GrammarProcessor:
        """A fresh processor for ``c``; ``GrammarError`` if the grammar does not compile."""
        try:
            from llguidance import LLMatcher
        except ImportError as e:  # pragma: no cover - depends on the install
            raise GrammarError("structured output on mlx needs llguidance: "
                               "pip install 'kvroute[mlx]'") from e
        tok = self._tokenizer()
        try:
            spec = grammar_spec(c)
        except GrammarError:
            raise
        except Exception as e:  # llguidance's converters raise plain errors on bad input
            raise GrammarError(f"{c.kind}: {e}") from e
        matcher = LLMatcher(tok, spec, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{c.kind}: {matcher.get_error()}")
        return GrammarProcessor(matcher, self.vocab)


def constrained(grammars: Grammars | None, jobs: list[Job]
                ) -> tuple[list[Job], dict[int, tuple[GrammarProcessor, ...]]]:
    """(the jobs kept, each constrained job's processors by ``id(job)``); a grammar that
    does not compile fails its job alone (a 400), as the batch's sampler guard does."""
    kept: list[Job] = []
    out: dict[int, tuple[GrammarProcessor, ...]] = {}
    for job in jobs:
        c = job.request.sampling.constraint
        if c is not None:
            try:
                if grammars is None:
                    raise GrammarError("the mlx engine is not loaded")
                out[id(job)] = (grammars.processor(c),)
            except InputRejected as e:
                job.prefill_left = 0
                job.put(e)
                continue
        kept.append(job)
    return kept, out
