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
