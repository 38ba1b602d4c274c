from workers.engines.stops import StopMatcher


def _run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    m, out = StopMatcher(stops), []
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_no_stops_passes_through() -> None:
    assert _run((), ["ab", "cd"]) == ("abcd", False)


def test_stop_split_across_pieces_is_never_emitted() -> None:
    assert _run(("END",), ["hello E", "N", "D tail"]) == ("hello ", True)


def test_partial_match_is_released_when_it_diverges() -> None:
    assert _run(("END",), ["x E", "Nx"]) == ("x ENx", False)


def test_earliest_of_several_stops_wins() -> None:
    assert _run(("bb", "a"), ["xxbba"]) == ("xx", True)


def test_an_unarmed_matcher_passes_text_through_and_holds_nothing() -> None:
    m = StopMatcher(("STOP",))
    m.armed = False
    assert m.feed("a ST") == ("a ST", False)
    assert m.feed("OP b") == ("OP b", False)
    m.armed = True
    assert m.feed("x STOP y") == ("x ", True)
