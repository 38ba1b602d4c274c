"""Incremental parsing of a model's text stream, shared by the tool-call and reasoning
parsers: a buffer that steps while a step can decide, and the marker-prefix hold-back."""

from __future__ import annotations

from typing import Generic, TypeVar

E = TypeVar("E")


class Buffered(Generic[E]):
    """A parser over a text buffer: ``feed`` appends and steps while ``_step`` can decide."""

    _buf: str

    def feed(self, text: str) -> list[E]:
        self._buf += text
        out: list[E] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[E]) -> bool:
        """Consume what can be decided now, appending events; True if there may be more."""
        raise NotImplementedError


def partial_suffix(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a marker (held
    back: the next chunk may complete the marker)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:n]):
                best = n
                break
    return best
