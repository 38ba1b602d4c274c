"""OpenAI replies over several choices (``n`` and batched completion prompts; the
fan-out itself: ``router.api.common.fanout``) and ``stream_options.continuous_usage_stats``.

- A choice's chunks carry its ``index`` (``prompt_index * n + i``); a whole reply lists
  the choices in that order.
- Usage, as OpenAI and vLLM count it: ``prompt_tokens`` (and ``cached_tokens``) once per
  prompt, from its first copy; ``completion_tokens`` summed over every choice. Streamed,
  it comes once at the end (``include_usage``), after every choice's finish chunk.
- ``continuous_usage_stats`` (vLLM's, with ``include_usage``): every chunk also carries
  ``usage``, that choice's prompt tokens and its output tokens so far.
- ``best_of``: vLLM's V1 engine samples no extra candidates to rank, so only ``best_of``
  equal to ``n`` (or absent) is served; any other is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from router.api.common.flow import Turn
from router.api.common.wire import sse, template
from router.api.openai.encode import DONE, ChunkEncoder, chat_chunk, text_chunk, usage_block
from router.api.openai.schema import MAX_CHOICES, CompletionRequest, SamplingFields
from router.errors import ApiError
from workers.protocol import Final, Usage

Live = Callable[[], tuple[int, int]]  # (prompt tokens, output tokens so far)
_MARK = "\x00"  # the text's place in a sample chunk (ids and names hold no NUL)


class ChoiceEncoder(ChunkEncoder):
    """A ``ChunkEncoder`` for choice ``index``; with ``live``, usage on every chunk."""

    def __init__(self, rid: str, model: str, chat: bool, fingerprint: str | None = None,
                 index: int = 0, live: Live | None = None) -> None:
        super().__init__(rid, model, chat, fingerprint)
        self.index, self.live = index, live
        if live is not None:  # every chunk's usage differs: no template
            self._parts = None
        elif index:
            sample = self._chunk({"content": _MARK} if chat else {"text": _MARK}, None)
            self._parts = template(sse(sample), _MARK)
            self._head, self._tail = self._parts or (b"", b"")

    def _chunk(self, delta: dict[str, Any], reason: str | None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            out = chat_chunk(self.rid, self.model, delta, reason, self.created, self.fp,
                             logprobs)
        else:
            out = text_chunk(self.rid, self.model, delta.get("text", ""), reason,
                             self.created, self.fp, logprobs)
        out["choices"][0]["index"] = self.index
        if self.live is not None:
            prompt, done = self.live()
            out["usage"] = {"prompt_tokens": prompt, "completion_tokens": done,
                            "total_tokens": prompt + done}
        return out

    def delta(self, delta: dict[str, Any], reason: str | None = None,
              logprobs: dict[str, Any] | None = None) -> bytes:
        return sse(self._chunk(delta, reason, logprobs))


def check_choices(req: SamplingFields) -> None:
    """A 400 naming the field for choices kvroute does not serve."""
    n = req.copies()
    if isinstance(req, CompletionRequest):
        if req.best_of is not None and req.best_of != n:
            raise ApiError(400, "best_of is not supported (only best_of equal to n), as "
                           "in vLLM's V1 engine", "invalid_request", "best_of")
        if len(req.prompts()) * n > MAX_CHOICES:
            raise ApiError(400, f"at most {MAX_CHOICES} choices (prompts × n) per request",
                           "invalid_request", "prompt")


def one_per_prompt(req: CompletionRequest) -> list[CompletionRequest]:
    """A batched completion as one request per prompt."""
    prompts = req.prompts()
    if len(prompts) == 1 and prompts[0] is req.prompt:
        return [req]
    return [req.model_copy(update={"prompt": p}) for p in prompts]


def whole_usage(turns: Sequence[Turn[Any, Any]], n: int) -> Final:
    """One usage for every choice: the prompts' once (each prompt's first copy), the
    output summed."""
    prompt = cached = out = 0
    for k, turn in enumerate(turns):
        gen, final = turn.gen, turn.gen.final
        out += final.usage.completion_tokens if final is not None else len(gen.sent)
        if k % n == 0:
            prompt += final.usage.prompt_tokens if final is not None else gen.prompt_tokens
            cached += final.usage.cached_tokens if final is not None else 0
    reason = "length" if any(t.gen.final and t.gen.final.finish_reason == "length"
                             for t in turns) else "stop"
    return Final(turns[0].gen.replica, Usage(prompt, out, cached), reason)


class ChoicesJoiner:
    """The OpenAI reply over several choices (``router.api.common.fanout.Joiner``)."""

    def __init__(self, turns: Sequence[Turn[Any, Any]], enc: ChunkEncoder | None, n: int,
                 include_usage: bool) -> None:
        self.turns, self.enc, self.n, self.include_usage = turns, enc, n, include_usage

    def body(self, bodies: list[dict[str, Any]]) -> dict[str, Any]:
        out = dict(bodies[0])
        out["choices"] = [b["choices"][0] for b in bodies]
        out["usage"] = usage_block(whole_usage(self.turns, self.n))
        return out

    def end(self) -> bytes:
        if self.include_usage and self.enc is not None:
            return self.enc.usage(whole_usage(self.turns, self.n)) + DONE
        return DONE

    def broken(self) -> bytes:
        return DONE
