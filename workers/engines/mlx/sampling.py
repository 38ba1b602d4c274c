"""Every sampling control on the mlx engine, per sequence of mlx-lm's ``BatchGenerator``.

A request's ``SamplingParams`` become three things the batch loop hands to
``BatchGenerator.insert`` (``workers.engines.mlx.batch``):

* ``make_sampler``: None (the batch's shared greedy argmax) or the request's own sampler.
  In vLLM's order: temperature, then min-p, top-k, top-p on the scaled distribution, then
  a draw, from the request's own PRNG key chain when it has a seed (its draws then do not
  depend on what else is in the batch), else from MLX's global generator.
* ``logits_processors``: functions ``(tokens, logits) -> logits`` run before the sampler
  (greedy requests too), in vLLM's meaning of each control: ``logit_bias`` added to its
  tokens' logits; ``min_tokens`` masks EOS and ``stop_token_ids`` until that many tokens
  are out; ``bad_words`` masks a word's last token once its other tokens were generated;
  ``presence_penalty`` / ``frequency_penalty`` subtract per output token (once / per
  occurrence) and ``repetition_penalty`` divides positive logits (multiplies negative
  ones) of every token seen in the prompt or the output. ``tokens`` is what the batch
  keeps for the sequence: the whole prompt, then each generated token, so the output is
  ``tokens[prompt_len:]``.
* ``stop_ids``: the token ids that end the sequence: EOS (none with ``ignore_eos``) and
  ``stop_token_ids``.

Everything is built on the engine thread, from values the router validated; input the
engine still cannot use (a seed outside ``[0, 2**64)``) is ``SamplingError``, a 400 for that
request alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from workers.protocol import InputRejected, SamplingParams

SEED_RANGE = (0, 2**64)  # what mx.random.key takes
Processor = Callable[[Any, Any], Any]


class SamplingError(InputRejected):
    """A job's sampling parameters the engine cannot use: the caller's input (a 400)."""


class RequestSampler:
    """One request's sampler over the processed logits' log-probabilities."""

    def __init__(self, sp: SamplingParams) -> None:
        import mlx.core as mx

        self._key = None if sp.seed is None else mx.random.key(sp.seed)
        self._inv_temp = 1.0 / sp.temperature
        self._min_p = sp.min_p if 0.0 < sp.min_p <= 1.0 else 0.0
        self._top_k = sp.top_k if sp.top_k > 0 else 0
        self._top_p = sp.top_p if 0.0 < sp.top_p < 1.0 else 0.0

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        x = logprobs * self._inv_temp
        if self._min_p:
            x = apply_min_p(x, self._min_p)
        if 0 < self._top_k < x.shape[-1]:
            x = apply_top_k(x, self._top_k)
        if self._top_p:
            x = apply_top_p(x - mx.logsumexp(x, axis=-1, keepdims=True), self._top_p)
        if self._key is None:
            return mx.random.categorical(x)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(x, key=sub)


def make_sampler(sp: SamplingParams) -> Any:
    """None (the batch's shared greedy sampler) or the request's own sampler."""
    if sp.temperature <= 0:
        return None
    lo, hi = SEED_RANGE
    if sp.seed is not None and not lo <= sp.seed < hi:
        raise SamplingError(f"seed: the mlx engine takes seeds in [0, 2**64), got {sp.seed}")
    return RequestSampler(sp)


def stop_ids(sp: SamplingParams, eos_ids: Iterable[int]) -> list[int]:
    """The token ids that end the sequence (EOS unless ``ignore_eos``, and stop ids). A
    constrained sequence always ends at EOS, which its grammar allows once complete."""
    keep_eos = not sp.ignore_eos or sp.constraint is not None
    ids = set(sp.stop_token_ids) | (set(eos_ids) if keep_eos else set())
    return sorted(ids)


def bad_word_ids(words: Iterable[str], encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Each bad word's token ids, as vLLM tokenizes them (``SamplingParams.
    update_from_tokenizer``): the word as written, and with a leading space when that is a
    different tokenization of the same length."""
    out: list[list[int]] = []
    for word in words:
        first = encode(word.lstrip())
        if first:
            out.append(first)
        spaced = encode(" " + word.lstrip())
        if spaced and (not first or (spaced[0] != first[0] and len(spaced) == len(first))):
            out.append(spaced)
    return out


class _Bias:
    def __init__(self, bias: tuple[tuple[int, float], ...]) -> None:
        self._bias = bias
        self._cols: Any = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self._cols is None:  # ids past the model's logits (a padded vocab) are dropped
            kept = [(t, b) for t, b in self._bias if 0 <= t < logits.shape[-1]]
            self._cols = (mx.array([t for t, _ in kept]), mx.array([b for _, b in kept],
                                                                   dtype=logits.dtype))
        cols, values = self._cols
        return logits.at[:, cols].add(values) if cols.size else logits


class _MinTokens:
    def __init__(self, prompt_len: int, min_tokens: int, ids: list[int]) -> None:
        self._end, self._ids = prompt_len + min_tokens, ids

    def __call__(self, tokens: Any, logits: Any) -> Any:
        if tokens.size >= self._end or not self._ids:
            return logits
        ids = [t for t in self._ids if t < logits.shape[-1]]
        logits[:, ids] = -math.inf
        return logits


class _BadWords:
    def __init__(self, prompt_len: int, words: list[list[int]]) -> None:
        self._prompt_len, self._words = prompt_len, words

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        out = tokens[self._prompt_len:]
        for word in self._words:
            *prefix, last = word
            if last >= logits.shape[-1] or len(prefix) > out.size:
                continue
            if not prefix:
                logits[:, last] = -math.inf
                continue
            hit = mx.all(out[-len(prefix):] == mx.array(prefix))
            logits[:, last] = mx.where(hit, -math.inf, logits[:, last])
        return logits


class _Penalties:
    """vLLM's three penalties: presence and frequency over the output, repetition over
    the prompt and the output."""

    def __init__(self, prompt_len: int, sp: SamplingParams) -> None:
        self._prompt_len = prompt_len
        self._presence, self._frequency = sp.presence_penalty, sp.frequency_penalty
        self._repetition = sp.repetition_penalty
        self._prompt_seen: Any = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        vocab = logits.shape[-1]
        out = tokens[self._prompt_len:]
        counts = (mx.zeros((vocab,), dtype=logits.dtype).at[out].add(1.0) if out.size
                  else mx.zeros((vocab,), dtype=logits.dtype))
        if self._repetition != 1.0:
            if self._prompt_seen is None:
                prompt = tokens[:self._prompt_len]
                self._prompt_seen = mx.zeros((vocab,)).at[prompt].add(1.0) > 0
            seen = self._prompt_seen | (counts > 0)
            penalised = mx.where(logits > 0, logits / self._repetition,
                                 logits * self._repetition)
            logits = mx.where(seen, penalised, logits)
        if self._frequency:
            logits = logits - self._frequency * counts
        if self._presence:
            logits = logits - self._presence * (counts > 0).astype(logits.dtype)
        return logits


def logits_processors(sp: SamplingParams, prompt_len: int, eos_ids: Iterable[int],
                      encode: Callable[[str], list[int]]) -> list[Processor]:
    """The request's processors, in vLLM's order (bias, min tokens, bad words, penalties);
    empty when every control is off (the sequence then costs the batch nothing)."""
    out: list[Processor] = []
    if sp.logit_bias:
        out.append(_Bias(sp.logit_bias))
    if sp.min_tokens > 0:
        out.append(_MinTokens(prompt_len, sp.min_tokens, stop_ids(sp, eos_ids)))
    if sp.bad_words and (words := bad_word_ids(sp.bad_words, encode)):
        out.append(_BadWords(prompt_len, words))
    if sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0:
        if sp.repetition_penalty <= 0:
            raise SamplingError("repetition_penalty: must be greater than zero")
        out.append(_Penalties(prompt_len, sp))
    return out


class SequenceSampling:
    """What ``BatchGenerator.insert`` takes for one sequence: its sampler (None: the
    batch's greedy one), its logits processors and the token ids that stop it."""

    __slots__ = ("processors", "sampler", "stops")

    def __init__(self, sp: SamplingParams, prompt_len: int, eos_ids: Iterable[int],
                 encode: Callable[[str], list[int]]) -> None:
        eos = list(eos_ids)
        self.sampler = make_sampler(sp)
        self.processors = logits_processors(sp, prompt_len, eos, encode)
        self.stops = stop_ids(sp, eos)
