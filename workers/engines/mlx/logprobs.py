"""Logprobs on the mlx engine, on its thread (``workers.engines.mlx.batch``).

Generated tokens: mlx-lm's ``BatchGenerator`` already normalises each step's logits into
logprobs (``GenerationBatch._step``: logits - logsumexp) and hands every sequence its row
(``Response.logprobs``, evaluated). ``attach`` reads the rows of the sequences that asked,
stacked into one array: the sampled token's logprob and rank, and the top k by one
``argpartition`` (then sorted), so a step costs a few batched ops however many ask.

Prompt tokens: a cached prefix holds KV, not logits, so ``prefill`` runs the whole prompt
but its last token through the model itself, in the engine's prefill chunks, reading each
position's logprobs on the way; the KV it builds is the sequence's cache, so the prompt is
prefilled once. Such a request reports no cached tokens, and the router does not score it
as a cache hit (``router.routing.lookup``).

Token text: each id decoded alone (``tokenizer.decode([id])``, as vLLM's server does),
memoised per engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.protocol import GenerateRequest, TokenChunk, TokenLogprob, TopLogprob


class TokenText:
    """Each token id's text, decoded alone once."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._seen: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._seen.get(token_id)
        if text is None:
            text = self._seen[token_id] = self._tok.decode([token_id])
        return text


@dataclass(slots=True)
class SeqLogprobs:
    """One sequence's request for logprobs (``top``: alternatives per token, None: no
    token logprobs) and those not yet released with its text."""

    top: int | None
    held: list[TokenLogprob] = field(default_factory=list)
    prompt: tuple[TokenLogprob, ...] = ()  # released with the first chunk

    def chunk(self, text: str, ids: Sequence[int]) -> TokenChunk:
        out = TokenChunk(text, tuple(ids), tuple(self.held), self.prompt)
        self.held, self.prompt = [], ()
        return out


def rows(lp: Any, tokens: Sequence[int], top: int, text: TokenText) -> list[TokenLogprob]:
    """``lp`` (positions × vocabulary logprobs, an mx array) read at ``tokens`` (one per
    position): each token's logprob and rank, and the position's ``top`` most likely."""
    import mlx.core as mx

    chosen_ids = mx.array(tokens)[:, None]
    chosen = mx.take_along_axis(lp, chosen_ids, axis=-1)
    ranks = (lp > chosen).sum(axis=-1) + 1
    if top > 0:
        idx = mx.argpartition(-lp, kth=top - 1, axis=-1)[:, :top]
        vals = mx.take_along_axis(lp, idx, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        idx = mx.take_along_axis(idx, order, axis=-1)
        vals = mx.take_along_axis(vals, order, axis=-1)
        mx.eval(chosen, ranks, idx, vals)
        top_ids, top_vals = idx.tolist(), vals.tolist()
    else:
        mx.eval(chosen, ranks)
        top_ids = top_vals = [[] for _ in tokens]
    out = []
    for t, c, r, ids, vals in zip(tokens, chosen[:, 0].tolist(), ranks.tolist(), top_ids,
                                  top_vals, strict=True):
        tops = tuple(TopLogprob(i, text(i), v) for i, v in zip(ids, vals, strict=True))
        out.append(TokenLogprob(t, text(t), c, r, tops))
    return out


def attach(wanting: Iterable[tuple[SeqLogprobs, int, Any]], text: TokenText) -> None:
    """One decode step's logprobs for the sequences that asked: (theirs, the sampled
    token, its row of ``Response.logprobs``), read together."""
    import mlx.core as mx

    asks = [(s, t, row) for s, t, row in wanting if s.top is not None]
    if not asks:
        return
    top = max(s.top or 0 for s, _, _ in asks)
    got = rows(mx.stack([row for _, _, row in asks]), [t for _, t, _ in asks], top, text)
    for (s, _, _), lp in zip(asks, got, strict=True):
        s.held.append(lp if len(lp.top) == s.top else
                      TokenLogprob(lp.token_id, lp.token, lp.logprob, lp.rank, lp.top[:s.top]))


def prefill(model: Any, ids: Sequence[int], top: int, step: int, text: TokenText
            ) -> tuple[list[Any], int, tuple[TokenLogprob, ...]]:
    """(the KV of ``ids[:-1]``, its length, prompt tokens 1..'s logprobs): the prompt
    but its last token run through ``model`` in ``step``-token chunks."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    head = list(ids[:-1])
    out: list[TokenLogprob] = []
    for start in range(0, len(head), step):
        chunk = head[start:start + step]
        logits = model(mx.array(chunk)[None], cache=cache)[0]
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # as mlx-lm's decode
        out.extend(rows(lp, ids[start + 1:start + 1 + len(chunk)], top, text))
        mx.clear_cache()
    return cache, len(head), tuple(out)


def asks(request: GenerateRequest) -> SeqLogprobs | None:
    """A sequence's token logprobs, if its request asks for them."""
    top = request.sampling.logprobs
    return None if top is None else SeqLogprobs(top)


def prompt_pass(model: Any, request: GenerateRequest, step: int, text: TokenText
                ) -> tuple[list[Any], int, SeqLogprobs]:
    """``prefill`` for a request that asks for prompt logprobs: (its KV, the tokens it
    covers, its sequence's logprobs with the prompt's)."""
    from mlx_lm.models.cache import make_prompt_cache

    ids, sp = request.token_ids, request.sampling
    seq = SeqLogprobs(sp.logprobs)
    if len(ids) < 2:
        return make_prompt_cache(model), 0, seq
    cache, n, seq.prompt = prefill(model, ids, sp.prompt_logprobs or 0, step, text)
    return cache, n, seq
