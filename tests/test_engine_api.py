"""The engine API contract, on the fake engine (the TUI and server tests build on it)."""
import pytest

from bw24chat.api import DoneEvent, EngineBusy, ErrorEvent, GenerationRequest, SamplingParams, StatsEvent, TokenEvent
from bw24chat.fake_engine import FakeEngine


def _req(text="hi", **sp):
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(**sp))


def test_stream_ends_with_exactly_one_final_event():
    e = FakeEngine(token_delay=0)
    try:
        evs = list(e.submit(_req()).events())
        assert isinstance(evs[-1], DoneEvent) and sum(isinstance(x, (DoneEvent, ErrorEvent)) for x in evs) == 1
        assert any(isinstance(x, StatsEvent) for x in evs)
        text = "".join(x.text for x in evs if isinstance(x, TokenEvent))
        assert text == evs[-1].text
    finally:
        e.close()


def test_request_needs_exactly_one_input():
    with pytest.raises(ValueError):
        GenerationRequest()
    with pytest.raises(ValueError):
        GenerationRequest(messages=[], prompt="x")


def test_bounded_queue_and_cancel_before_start():
    e = FakeEngine(token_delay=0.05, max_queue=1)
    try:
        first = e.submit(_req("[[slow]]"))
        assert isinstance(first.get(timeout=10), (TokenEvent, StatsEvent))  # running, so off the queue
        second = e.submit(_req())
        with pytest.raises(EngineBusy):
            e.submit(_req())
        second.cancel()
        first.cancel()
        assert first.result()[1].finish_reason == "cancelled"
        assert second.result()[1].finish_reason == "cancelled"
    finally:
        e.close()


def test_error_mid_stream_and_callback_delivery():
    e = FakeEngine(token_delay=0)
    got = []
    try:
        h = e.submit(_req("[[error]]"), on_event=got.append)
        _, final = h.result()
        assert isinstance(final, ErrorEvent) and got[-1] is final
    finally:
        e.close()
