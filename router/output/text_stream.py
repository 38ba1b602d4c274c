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
    best, size = 0, len(buf)
    for marker in markers:
        if not marker:
            continue
        # Only a place where the marker's first character is can start such a suffix
        # (one ``find`` per candidate, not an ``endswith`` per length: this runs per chunk).
        i = buf.find(marker[0], max(size - len(marker) + 1, 0))
        while 0 <= i < size - best:
            if marker.startswith(buf[i:]):  # the longest first: i only grows
                best = size - i
                break
            i = buf.find(marker[0], i + 1)
    return best
