"""Running a tool-call parser on a recorded output: whole, a character at a time, and in
random small pieces (the streaming cases); all must give the same events, and no text
event may hold markup (a piece of a marker the whole output's text does not have)."""

from __future__ import annotations

import random
from typing import Any

from router.output.tool_parsers import FAMILIES, ToolCall, make_parser

Expected = list[str | ToolCall]


def run(family: str, chunks: list[str], schemas: dict[str, Any] | None = None) -> Expected:
    parser = make_parser(family, schemas)
    assert parser is not None
    out: Expected = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.flush()


def merged(events: Expected) -> Expected:
    """Adjacent text events joined: the same content however the output was chunked."""
    out: Expected = []
    for ev in events:
        if isinstance(ev, str) and out and isinstance(out[-1], str):
            out[-1] += ev
        elif ev != "":
            out.append(ev)
    return out


def pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


def check_streaming(family: str, text: str, expected: Expected,
                    schemas: dict[str, Any] | None = None, tries: int = 20) -> None:
    assert merged(run(family, [text], schemas)) == expected
    assert merged(run(family, list(text), schemas)) == expected  # a character at a time
    rng = random.Random(len(text))
    start = FAMILIES[family].start
    wanted_text = "".join(e for e in expected if isinstance(e, str))
    for _ in range(tries):
        events = run(family, pieces(text, rng), schemas)
        assert merged(events) == expected
        for ev in events:  # a marker's first characters never leak unless really text
            if isinstance(ev, str) and start[:2] in ev:
                assert start[:2] in wanted_text
