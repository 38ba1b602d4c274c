"""Logprobs in OpenAI's shapes, as vLLM's server writes them, from the engines' per-token
records (``workers.protocol.TokenLogprob``).

- Chat (``logprobs: true``, ``top_logprobs`` 0..20): ``choices[].logprobs.content``, one
  ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`` per token, the top
  list the position's most likely tokens, most likely first.
- Completions (``logprobs`` 0..20, vLLM's bound; OpenAI's is 5): ``{tokens,
  token_logprobs, top_logprobs, text_offset}``. Each ``top_logprobs`` entry maps token text
  to logprob: the position's token first, then the most likely ones, ``logprobs + 1``
  entries at most (OpenAI's "up to logprobs+1"). With ``echo`` the prompt's tokens come
  first; its first token has no logprob (``None`` in both lists).
- Token text is each id decoded alone (vLLM's ``tokenizer.decode(id)``) and ``bytes`` its
  UTF-8 (vLLM's, a partial character as U+FFFD). A logprob below -9999 is -9999.0, the
  value OpenAI uses for "very unlikely" (and JSON has no -Infinity).

``LogprobTap`` reads the records off a generation's chunks as its reply consumes them: a
stream attaches the ones read so far to the next delta it sends (those whose text a
parser held go with the next piece of text, or the stream's end); a whole reply lists
them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from router.api.common.reply import Stream
from router.api.openai.schema import ChatCompletionRequest, CompletionRequest
from router.errors import ApiError
from workers.protocol import Chunk, Final, SamplingParams, TokenLogprob, WorkerMessage

FLOOR = -9999.0


def _lp(v: float) -> float:
    return v if v > FLOOR else FLOOR


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def with_logprobs(sp: SamplingParams, logprobs: int | None, prompt_logprobs: int | None
                  ) -> SamplingParams:
    """``sp`` asking the engine for them (None: not asked)."""
    if logprobs is None and prompt_logprobs is None:
        return sp
    return dataclasses.replace(sp, logprobs=logprobs, prompt_logprobs=prompt_logprobs)


class LogprobTap:
    """A generation (``Stream``) whose chunks' logprobs are kept as they are read:
    ``pending`` until a delta takes them, ``read`` all of them, ``prompt`` the prompt's."""

    def __init__(self, gen: Stream) -> None:
        self.gen = gen
        self.pending: list[TokenLogprob] = []
        self.read: list[TokenLogprob] = []
        self.prompt: tuple[TokenLogprob, ...] = ()

    @property
    def replica(self) -> str:
        return self.gen.replica

    @property
    def final(self) -> Final | None:
        return self.gen.final

    def __getattr__(self, name: str) -> Any:  # the rest of the generation (prompt_tokens…)
        return getattr(self.gen, name)

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        async for msg in self.gen.messages():
            if isinstance(msg, Chunk):
                if msg.logprobs:
                    self.pending.extend(msg.logprobs)
                    self.read.extend(msg.logprobs)
                self.prompt = self.prompt or msg.prompt_logprobs
            yield msg

    def close(self) -> None:
        self.gen.close()

    def take(self) -> list[TokenLogprob]:
        out, self.pending = self.pending, []
        return out


# -- chat ----------------------------------------------------------------------------
def chat_entry(x: TokenLogprob, top: int) -> dict[str, Any]:
    return {"token": x.token, "logprob": _lp(x.logprob), "bytes": _bytes(x.token),
            "top_logprobs": [{"token": t.token, "logprob": _lp(t.logprob),
                              "bytes": _bytes(t.token)} for t in x.top[:top]]}


def chat_logprobs(entries: list[TokenLogprob], top: int) -> dict[str, Any]:
    return {"content": [chat_entry(x, top) for x in entries]}


# -- completions ---------------------------------------------------------------------
def _top_map(x: TokenLogprob, top: int) -> dict[str, float]:
    """vLLM's: the position's token first, then the most likely, ``top + 1`` at most."""
    out = {x.token: _lp(x.logprob)}
    for t in x.top:
        if len(out) > top:
            break
        if t.token_id != x.token_id:
            out.setdefault(t.token, _lp(t.logprob))
    return out


class CompletionLogprobs:
    """A completion's ``logprobs`` object, whole or chunk by chunk (``text_offset``
    counts on across chunks, from the echoed prompt's start when there is one)."""

    def __init__(self, top: int) -> None:
        self.top, self.offset = top, 0

    def block(self, entries: list[TokenLogprob | None], first_token: str = ""
              ) -> dict[str, Any]:
        """Entries (None: a prompt's first token, ``first_token`` its text)."""
        tokens, values, tops, offsets = [], [], [], []
        for x in entries:
            token = first_token if x is None else x.token
            tokens.append(token)
            values.append(None if x is None else _lp(x.logprob))
            tops.append(None if x is None else _top_map(x, self.top))
            offsets.append(self.offset)
            self.offset += len(token)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}


# -- vLLM's prompt_logprobs ----------------------------------------------------------
def vllm_prompt_logprobs(entries: tuple[TokenLogprob, ...], top: int
                         ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: None for the first token, then per token its id's and
    the top ids' ``{logprob, rank, decoded_token}``."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for x in entries:
        row = {str(x.token_id): {"logprob": _lp(x.logprob), "rank": x.rank,
                                 "decoded_token": x.token}}
        for rank, t in enumerate(x.top[:top], start=1):
            row.setdefault(str(t.token_id), {"logprob": _lp(t.logprob), "rank": rank,
                                             "decoded_token": t.token})
        out.append(row)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Asks:
    """What a request asks of logprobs: ``top`` alternatives per generated token (None:
    no logprobs), the prompt's (``prompt``, for ``echo`` or vLLM's ``prompt_logprobs``),
    the echoed prompt's text (completions), and whether vLLM's ``prompt_logprobs`` field
    is answered (``vllm_prompt``)."""


    top: int | None = None
    prompt: int | None = None
    echo: str | None = None
    vllm_prompt: bool = False
    first_token: str = ""  # the prompt's first token's text (it has no logprob)

    @property
    def any(self) -> bool:
        return self.top is not None or self.prompt is not None or self.echo is not None


class Notes:
    """What a chat or completion reply adds to its text: logprobs (from ``tap``) and, on a
    completion, the echoed prompt (sent before the first text)."""

    def __init__(self, tap: LogprobTap, asks: Asks, chat: bool) -> None:
        self.tap, self.asks, self.chat = tap, asks, chat
        self.blocks = CompletionLogprobs(asks.top or 0)
        self._echoed = asks.echo is None

    def piece(self, text: str) -> tuple[str, dict[str, Any] | None]:
        """A streamed piece: its text (the echo first) and the logprobs read since the last."""
        entries: list[TokenLogprob | None] = list(self.tap.take())
        if not self._echoed:
            self._echoed = True
            text = (self.asks.echo or "") + text
            if self.asks.top is not None:
                entries = [None, *self.tap.prompt, *entries]
        return text, self._shape(entries)

    def whole(self, text: str) -> tuple[str, dict[str, Any] | None]:
        """The whole reply's text and logprobs."""
        entries: list[TokenLogprob | None] = list(self.tap.read)
        if self.asks.echo is not None:
            text = self.asks.echo + text
            if self.asks.top is not None:
                entries = [None, *self.tap.prompt, *entries]
        return text, self._shape(entries)

    def prompt_logprobs(self) -> list[dict[str, dict[str, Any]] | None] | None:
        if not self.asks.vllm_prompt:
            return None
        return vllm_prompt_logprobs(self.tap.prompt, self.asks.prompt or 0)

    def _shape(self, entries: list[TokenLogprob | None]) -> dict[str, Any] | None:
        if self.asks.top is None or not entries:
            return None
        if self.chat:
            return chat_logprobs([x for x in entries if x is not None], self.asks.top)
        return self.blocks.block(entries, self.asks.first_token)


def chat_asks(req: ChatCompletionRequest) -> Asks:
    """A chat request's logprobs (OpenAI's rules, vLLM's messages); 400 naming the field."""
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true",
                       "invalid_request", "top_logprobs")
    _no_stream(req.stream, req.prompt_logprobs)
    return Asks(top=(req.top_logprobs or 0) if req.logprobs else None,
                prompt=req.prompt_logprobs, vllm_prompt=req.prompt_logprobs is not None)


def completion_asks(req: CompletionRequest, prompt_text: str, first_token: str) -> Asks:
    """A completion's: ``logprobs``; ``echo`` (with ``logprobs``: the prompt's too); vLLM's
    ``prompt_logprobs``."""
    _no_stream(req.stream, req.prompt_logprobs)
    echoed = req.logprobs if req.echo else None
    prompt = max((n for n in (echoed, req.prompt_logprobs) if n is not None), default=None)
    return Asks(top=req.logprobs, prompt=prompt, echo=prompt_text if req.echo else None,
                vllm_prompt=req.prompt_logprobs is not None, first_token=first_token)


def asks_of(req: Any, ids: list[int], decode: Callable[[list[int]], str]) -> Asks:
    """What a chat or completion request asks (``decode``: the model's tokenizer's, for
    an echoed prompt of token ids and the prompt's first token)."""
    if isinstance(req, ChatCompletionRequest):
        return chat_asks(req)
    if not isinstance(req, CompletionRequest) or not (
            req.echo or req.logprobs is not None or req.prompt_logprobs is not None):
        return Asks()
    text = req.prompt if isinstance(req.prompt, str) else decode(ids)
    return completion_asks(req, text, decode(ids[:1]))


def _no_stream(stream: bool, prompt_logprobs: int | None) -> None:
    if stream and prompt_logprobs is not None:  # as vLLM
        raise ApiError(400, "`prompt_logprobs` are not available when `stream=True`",
                       "invalid_request", "prompt_logprobs")
