"""``partial_suffix`` (the marker hold-back every incremental parser runs per chunk) gives
what the plain definition gives: the longest suffix that is a proper prefix of a marker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.output.text_stream import partial_suffix

MARKERS = ("<tool_call>", "</think>", "<|channel|>", "<｜tool▁calls▁begin｜>", "[TOOL_CALLS]",
           "<<", "x", "")
# Text made mostly of the markers' own characters, so partial markers are common.
TEXT = st.text(st.sampled_from(sorted(set("".join(MARKERS)) | {" ", "\n", "é", "w"})),
               max_size=30)


def reference(buf: str, markers: tuple[str, ...]) -> int:
    """The definition, checked length by length."""
    return max((n for m in markers for n in range(1, len(m)) if buf.endswith(m[:n])),
               default=0)


@settings(max_examples=500, deadline=None)
@given(buf=TEXT, markers=st.lists(st.sampled_from(MARKERS), max_size=4).map(tuple),
       tail=st.sampled_from(MARKERS).flatmap(lambda m: st.sampled_from(
           [m[:n] for n in range(len(m) + 1)])))
def test_partial_suffix_matches_the_definition(buf: str, markers: tuple[str, ...],
                                               tail: str) -> None:
    text = buf + tail  # often ends inside a marker
    assert partial_suffix(text, markers) == reference(text, markers)


def test_partial_suffix_examples() -> None:
    assert partial_suffix("hello <tool", ("<tool_call>",)) == 5
    assert partial_suffix("a <tool_call>", ("<tool_call>",)) == 0  # whole: not held
    assert partial_suffix("<<<", ("<<x", "<")) == 2
    assert partial_suffix("", ("<a>",)) == 0
