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


def test_ignore_eos_decodes_through_the_stop_ids():
    """ignore_eos (the server's load-test parameter): a stop id neither ends the generation nor
    is dropped; max_tokens still does."""
    from dataclasses import replace

    from bw24chat.api import SamplingParams
    from bw24chat.check import word_tokenizer
    from bw24chat.generate import Output

    tok = replace(word_tokenizer(8), stop_ids={3})
    for ignore, ids, finish in ((False, [1, 2], "stop"), (True, [1, 2, 3, 4, 3], "length")):
        out = Output(tok, SamplingParams(max_tokens=5, ignore_eos=ignore), n_prompt=2, n_ctx=64)
        for t in (1, 2, 3, 4, 3, 5, 6):
            if not out.feed(t, lambda: None):
                break
        assert (out.ids, out.finish) == (ids, finish)
