"""vLLM's own logprobs (``SamplingParams.logprobs`` / ``prompt_logprobs``) as the engine
protocol's records.

vLLM gives each position a mapping of token id → ``Logprob(logprob, rank,
decoded_token)``: the position's own token (sampled, or the prompt's) and the top k by
rank. The record keeps the own token's logprob and rank, and the top k, most likely first
(ranks 1..k). ``RequestOutput.prompt_logprobs`` starts with None (the first prompt token
has no logprob): the record holds tokens 1.. only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.protocol import GenerateRequest, TokenChunk, TokenLogprob, TopLogprob


def position(token_id: int, entries: Mapping[int, Any], top: int) -> TokenLogprob:
    own = entries.get(token_id)
    ranked = sorted(((t, x) for t, x in entries.items() if x.rank is not None and x.rank <= top),
                    key=lambda p: p[1].rank)
    tops = tuple(TopLogprob(t, x.decoded_token or "", x.logprob) for t, x in ranked)
    if own is None:  # not reported: vLLM always reports it, so this is a defensive floor
        return TokenLogprob(token_id, "", float("-inf"), 0, tops)
    return TokenLogprob(token_id, own.decoded_token or "", own.logprob, own.rank or 1, tops)


def chunk(text: str, token_ids: Sequence[int], logprobs: Sequence[Any] | None,
          prompt: Sequence[Any] | None, request: GenerateRequest) -> TokenChunk:
    """A chunk of vLLM's output with its tokens' logprobs and (``prompt``: the first
    output's ``prompt_logprobs``) the prompt's."""
    sp = request.sampling
    lps: tuple[TokenLogprob, ...] = ()
    if sp.logprobs is not None and logprobs:
        lps = tuple(position(t, d, sp.logprobs) for t, d in zip(token_ids, logprobs, strict=False))
    first: tuple[TokenLogprob, ...] = ()
    if sp.prompt_logprobs is not None and prompt:
        ids = request.token_ids
        first = tuple(position(ids[i], d, sp.prompt_logprobs)
                      for i, d in enumerate(prompt) if i > 0 and d is not None)
    return TokenChunk(text, tuple(token_ids), lps, first)
