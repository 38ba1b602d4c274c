"""The emulator's logprobs: deterministic synthetic values, valid as a model's would be.

No model runs, so the values only have to be well formed and repeatable: a pure function
of (token id, position). Each position's emitted token is its most likely one (rank 1, as
a greedy model's), with a probability in [0.4, 0.95]; the alternatives follow in strictly
decreasing order and share less than the rest, so every logprob is below 0 and a
position's probabilities never sum past 1. Alternatives are other tokens the emulator
emits (its vocabulary, ``workers.engines.sim.vocab``), or the next ids without one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import xxhash

from workers.protocol import TokenLogprob, TopLogprob

_SPREAD = 1 << 16


def _unit(token_id: int, position: int) -> float:
    """A repeatable number in [0, 1) for (token, position)."""
    return (xxhash.xxh32_intdigest(f"{token_id}:{position}".encode()) % _SPREAD) / _SPREAD


class SimLogprobs:
    """Synthetic logprobs over ``ids`` (the tokens the emulator emits; None: every id)
    with their text (``text``, as the emulator writes each token)."""

    def __init__(self, ids: Sequence[int] | None, text: Callable[[int], str]) -> None:
        self._ids, self._text = ids, text

    def at(self, token_id: int, position: int, top: int, token: str | None = None
           ) -> TokenLogprob:
        """``token_id`` at ``position`` with ``top`` alternatives (``token``: its text, when
        it is not the vocabulary's, as a scripted reply's)."""
        first = math.log(0.4 + 0.55 * _unit(token_id, position))
        rest = 1.0 - math.exp(first)
        tops = [TopLogprob(token_id, token if token is not None else self._text(token_id),
                           first)]
        for i, alt in enumerate(self._alternatives(token_id, position, top - 1), start=1):
            tops.append(TopLogprob(alt, self._text(alt), math.log(rest * 0.9 / 2**i)))
        return TokenLogprob(token_id, tops[0].token, first, 1, tuple(tops[:top]))

    def prompt(self, ids: Sequence[int], top: int) -> tuple[TokenLogprob, ...]:
        """Prompt tokens 1.. (the first has no logprob)."""
        return tuple(self.at(t, i, top) for i, t in enumerate(ids) if i > 0)

    def _alternatives(self, token_id: int, position: int, n: int) -> list[int]:
        if n <= 0:
            return []
        pool = self._ids
        if not pool:
            return [token_id + 1 + i for i in range(n)]
        start = int(_unit(token_id, position + 1) * len(pool))
        out: list[int] = []
        for j in range(len(pool)):
            alt = pool[(start + j) % len(pool)]
            if alt != token_id:
                out.append(alt)
                if len(out) == n:
                    break
        return out
