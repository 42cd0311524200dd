from bw24chat.stopping import StopMatcher


def _run(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    return out + m.flush(), m.stopped


def test_stop_string_split_across_pieces_is_never_emitted():
    text, stopped = _run(["</end>"], ["Hello </", "en", "d> more"])
    assert (text, stopped) == ("Hello ", True)


def test_false_start_is_released():
    text, stopped = _run(["STOP"], ["a ST", "x b S"])
    assert (text, stopped) == ("a STx b S", False)


def test_earliest_of_several_stops():
    assert _run(["b", "ab"], ["xxab"]) == ("xx", True)


def test_no_stops_passthrough():
    assert _run([], ["a", "b"]) == ("ab", False)
