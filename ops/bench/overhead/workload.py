"""The fixed streaming workload of ``kvroute bench overhead``: chat requests of a fixed
prompt length, sent in a closed loop at one concurrency.

Two modes, both deterministic functions of a salt, so the bare server and kvroute get
exactly the same requests:

* ``shared``: every prompt starts with the same ``prefix_tokens`` of text (the salt first,
  so no earlier run's cache helps), then a request-unique marker and the rest: after the
  first request a server with a prefix cache serves the prefix from it;
* ``cold``: a request-unique marker comes first, so no prompt shares more than the chat
  template's opening with any other.

Lengths are in the model's own tokens: the text is a slice of the corpus's token ids
decoded back (``PromptText``), so a prompt tokenizes to about the length asked (the chat
template adds a few); the servers' ``usage`` reports the real counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ops.bench.harness.client import Runner
from ops.bench.harness.workloads import CHAT_PATH, BenchRequest

MODES = ("shared", "cold")


@dataclass(frozen=True, slots=True)
class Workload:
    prompt_tokens: int = 128  # each prompt, about (the template adds a few)
    prefix_tokens: int = 96  # shared mode: the common prefix
    max_tokens: int = 32  # each reply

    def __post_init__(self) -> None:
        if not 0 < self.prefix_tokens < self.prompt_tokens or self.max_tokens < 1:
            raise ValueError("need 0 < prefix_tokens < prompt_tokens and max_tokens >= 1")


class PromptText:
    """Text of about ``n`` tokens of ``model_path``'s tokenizer, from the tiny corpus."""

    def __init__(self, model_path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        from ops.models.tiny_model import CORPUS_PATH

        text = CORPUS_PATH.read_text()
        self._ids = self._tok.encode(text, add_special_tokens=False).ids

    def piece(self, n: int, start: int = 0) -> str:
        ids = self._ids
        begin = start % max(1, len(ids) - n)
        return self._tok.decode(ids[begin:begin + n])


def requests(mode: str, salt: str, wl: Workload, text: PromptText) -> Iterator[BenchRequest]:
    """The run's requests, in order, without end."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    prefix = f"[{salt}] " + text.piece(wl.prefix_tokens)
    rest = text.piece(wl.prompt_tokens - wl.prefix_tokens, start=wl.prefix_tokens)
    whole = text.piece(wl.prompt_tokens)
    for i in itertools.count():
        if mode == "shared":
            content = f"{prefix} [{salt} #{i}] {rest}"
        else:  # the request's number first: nothing after the template's opening is shared
            content = f"{i} {salt} {whole}"
        body = {"messages": [{"role": "user", "content": content}],
                "max_tokens": wl.max_tokens, "temperature": 0}
        yield BenchRequest(f"{mode}.{i}", CHAT_PATH, body)


def closed_loop(reqs: Iterator[BenchRequest], concurrency: int
                ) -> Callable[[Runner], Awaitable[None]]:
    """``concurrency`` slots, each sending the next request when its last one ends."""

    async def slot(runner: Runner) -> None:
        for req in reqs:
            if await runner.call(req) is None:
                return

    async def drive(runner: Runner) -> None:
        for _ in range(concurrency):
            runner.spawn(slot(runner))

    return drive
