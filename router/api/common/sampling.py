"""Sampling controls, as every API's schema takes them and as the engines get them.

``EngineControls`` holds vLLM's sampling fields beyond OpenAI's temperature and top-p
(top-k, min-p, the three penalties, logit bias, stop token ids, ignore_eos), checked as
vLLM checks them (``SamplingParams._verify_args``); ``OutputControls`` adds the ones of
vLLM's chat and completions only (min_tokens, bad_words). A schema inherits them;
``params`` turns a request into the worker's ``SamplingParams``, with vLLM's defaults for
what it leaves unset: the model's ``generation_config.json``, else OpenAI's
(``router.prompt.generation``). Which API honours which field: ``router.api.common.fields``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from router.errors import ApiError
from router.prompt.tokenizer import ChatTokenizer
from workers.protocol import SamplingParams

MAX_BIAS = 100.0  # vLLM clamps each bias to [-100, 100]
MAX_IDS = 1024  # logit_bias entries and stop token ids per request
MAX_BAD_WORDS, MAX_WORD_CHARS = 64, 512


class EngineControls(BaseModel):
    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(None, ge=-1, description="0 or -1: off (vLLM's)")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, max_length=MAX_IDS)
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=2**32)]] | None = Field(
        None, max_length=MAX_IDS)
    ignore_eos: bool = False

    @field_validator("logit_bias")
    @classmethod
    def _token_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if not key.strip().lstrip("-").isdigit():
                raise ValueError(f"keys must be token ids, got {key[:40]!r}")
        return v

    def bias(self, vocab_size: int) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, clamped bias); an id outside the vocabulary is a 400
        naming it, as vLLM answers."""
        out = []
        for key, value in (self.logit_bias or {}).items():
            token = int(key)
            if not 0 <= token < vocab_size:
                raise ApiError(400, f"logit_bias: token id {token} is outside the vocabulary "
                               f"[0, {vocab_size})", "invalid_request", "logit_bias")
            out.append((token, max(-MAX_BIAS, min(MAX_BIAS, value))))
        return tuple(out)


class OutputControls(EngineControls):
    min_tokens: int | None = Field(None, ge=0)
    bad_words: list[Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS)]] | None = \
        Field(None, max_length=MAX_BAD_WORDS)


MAX_STOPS, MAX_STOP_CHARS = 16, 512  # stop matching costs grow with their number and length


def check_stops(v: str | list[str] | None) -> str | list[str] | None:
    """A request's stop strings within the caps (a ``ValueError`` naming the cap)."""
    if isinstance(v, list) and len(v) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences")
    if any(len(s) > MAX_STOP_CHARS for s in ([v] if isinstance(v, str) else v or [])):
        raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters")
    return v


def stop_tuple(v: str | list[str] | None) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def check_min_tokens(min_tokens: int | None, max_tokens: int | None) -> None:
    """vLLM's rule: min_tokens at most the request's max_tokens (a 400 naming it)."""
    if min_tokens and max_tokens is not None and min_tokens > max_tokens:
        raise ValueError(f"min_tokens ({min_tokens}) must be at most max_tokens ({max_tokens})")


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


def params(tok: ChatTokenizer, max_tokens: int, temperature: float | None, top_p: float | None,
           stop: tuple[str, ...] = (), seed: int | None = None, top_k: int | None = None,
           controls: EngineControls | None = None) -> SamplingParams:
    """The worker's sampling, unset fields from the model's defaults (``tok.generation``).
    ``controls``: the request's engine controls (None: the API has none but ``top_k``)."""
    d = tok.generation
    c = controls or EngineControls()
    k = top_k if top_k is not None else c.top_k
    min_tokens = getattr(c, "min_tokens", None) or 0
    return SamplingParams(
        max_tokens=max_tokens, temperature=_pick(temperature, d.temperature),
        top_p=_pick(top_p, d.top_p), stop=stop, seed=seed, ignore_eos=c.ignore_eos,
        top_k=max(0, int(_pick(k, d.top_k))), min_p=_pick(c.min_p, d.min_p),
        presence_penalty=_pick(c.presence_penalty, d.presence_penalty),
        frequency_penalty=_pick(c.frequency_penalty, d.frequency_penalty),
        repetition_penalty=_pick(c.repetition_penalty, d.repetition_penalty),
        logit_bias=c.bias(tok.vocab_size),
        min_tokens=min(min_tokens, max_tokens),  # a budget cut to fit the window wins
        stop_token_ids=tuple(dict.fromkeys(c.stop_token_ids or ())),
        bad_words=tuple(getattr(c, "bad_words", None) or ()),
    )
