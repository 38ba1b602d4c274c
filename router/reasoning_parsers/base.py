"""What every reasoning parser shares: the ``Reasoning`` event and the parser protocol.

A parser is incremental: ``feed(text)`` returns what is safe to emit now, ``flush()``
the rest at the end of the generation. Its events are ``Reasoning`` (thinking text)
or ``str`` (the answer, which the tool-call parser reads next). A tail that could be
the start of a marker is held until it is known, so no markup reaches a client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A piece of the model's reasoning (never part of the answer)."""

    text: str


Piece = Reasoning | str


class ReasoningParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def flush(self) -> list[Piece]: ...


class Buffered:
    """A parser over a text buffer: ``feed`` appends and steps while ``_step`` can decide."""

    _buf: str

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Piece]) -> bool:
        raise NotImplementedError


def partial_suffix(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:n]):
                best = n
                break
    return best


def emit(out: list[Piece], piece: Piece) -> None:
    """Append, merging with the previous piece of the same kind; empty pieces vanish."""
    if not (piece.text if isinstance(piece, Reasoning) else piece):
        return
    if out and isinstance(piece, Reasoning) and isinstance(out[-1], Reasoning):
        out[-1] = Reasoning(out[-1].text + piece.text)
    elif out and isinstance(piece, str) and isinstance(out[-1], str):
        out[-1] += piece
    else:
        out.append(piece)
