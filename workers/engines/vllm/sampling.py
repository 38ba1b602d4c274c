"""The sampling controls on vLLM: ``SamplingParams``' controls as the keyword arguments of
vLLM's own ``SamplingParams`` (each one is vLLM's, with its meaning; vLLM validates them
again and refuses a bad one with a ``ValueError``, which the worker returns as a 400).

Only controls that are on are passed, so vLLM's defaults stay vLLM's."""

from __future__ import annotations

from typing import Any

from workers.protocol import SamplingParams


def vllm_controls(sp: SamplingParams) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``SamplingParams`` for ``sp``'s controls."""
    out: dict[str, Any] = {}
    if sp.top_k > 0:
        out["top_k"] = sp.top_k
    if sp.min_p > 0:
        out["min_p"] = sp.min_p
    if sp.presence_penalty:
        out["presence_penalty"] = sp.presence_penalty
    if sp.frequency_penalty:
        out["frequency_penalty"] = sp.frequency_penalty
    if sp.repetition_penalty != 1.0:
        out["repetition_penalty"] = sp.repetition_penalty
    if sp.logit_bias:
        out["logit_bias"] = dict(sp.logit_bias)
    if sp.min_tokens:
        out["min_tokens"] = sp.min_tokens
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.bad_words:
        out["bad_words"] = list(sp.bad_words)
    return out
