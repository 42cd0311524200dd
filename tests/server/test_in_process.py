"""The server run from a thread of this process (``start_in_thread``, as the TUI would), and what
reaches the engine: sampling parameters, defaults, the reported model name."""
from __future__ import annotations

import httpx
import openai
import pytest

from bw24chat.api import SamplingParams
from bw24chat.fake_engine import FakeEngine
from bw24chat.server import start_in_thread
from bw24chat.server.protocol import APIError, Limits, parse_chat


@pytest.fixture
def served():
    """(fake engine, base URL) for a server in a thread, with engine defaults set."""
    engine = FakeEngine(replies=["one two three four five six"], token_delay=0)
    defaults = SamplingParams(temperature=0.25, top_p=0.8, max_tokens=5, stop=["six"])
    server, thread = start_in_thread(engine, port=0, api_key="k", defaults=defaults, model_name="my-model",
                                     max_tokens_cap=100)
    try:
        yield engine, server.url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.close()
    assert not thread.is_alive()


def test_start_in_thread_serves(served):
    engine, url = served
    assert httpx.get(url + "/health").json()["model"] == "my-model"
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    r = client.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "hi"}])
    assert r.model == "my-model"
    assert [m.id for m in client.models.list()] == ["my-model"]


def test_sampling_parameters_reach_the_engine(served):
    engine, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(
        model="my-model", messages=[{"role": "user", "content": "hi"}], temperature=1.3, top_p=0.5, seed=99,
        max_tokens=9, stop=["x", "y"], extra_body={"top_k": 40, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": True},
    )
    sp = engine.requests[-1].sampling
    assert (sp.temperature, sp.top_p, sp.seed, sp.max_tokens, sp.stop) == (1.3, 0.5, 99, 9, ["x", "y"])
    assert (sp.top_k, sp.min_p, sp.repeat_penalty, sp.ignore_eos) == (40, 0.1, 1.2, True)
    assert engine.requests[-1].messages == [{"role": "user", "content": "hi"}]

    r = client.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "hi"}])
    sp = engine.requests[-1].sampling
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.stop, sp.seed) == (0.25, 0.8, 5, ["six"], None)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5

    client.completions.create(model="my-model", prompt="p", max_tokens=3, logprobs=2)
    req = engine.requests[-1]
    assert req.prompt == "p" and req.messages is None and req.sampling.max_tokens == 3 and req.logprobs == 2
    assert not req.echo  # echo is done by the server, not the engine


def test_protocol_parsing():
    limits = Limits(max_tokens_cap=50, defaults=SamplingParams(max_tokens=512))
    p = parse_chat({"messages": [{"role": "developer", "content": "sys"}, {"role": "user", "content": None}],
                    "max_tokens": 10, "max_completion_tokens": 20, "logprobs": True}, limits)
    assert p.generation.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": ""}]
    assert p.generation.sampling.max_tokens == 20  # max_completion_tokens wins
    assert p.generation.sampling.seed is None
    assert p.logprobs == 0 and p.generation.logprobs == 1  # the chosen token's logprob, no alternatives
    assert parse_chat({"messages": [{"role": "user", "content": "x"}]}, limits).generation.sampling.max_tokens == 50
    with pytest.raises(APIError) as e:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "stream_options": []}, limits)
    assert e.value.status == 400 and e.value.param == "stream_options"


def test_the_speculative_extension(served):
    """``speculative`` / ``speculative_k`` choose speculative decoding per request; omitted, the
    engine's own setting applies (None); bad values are refused before the engine sees them."""
    engine, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    chat = dict(model="my-model", messages=[{"role": "user", "content": "hi"}])
    client.chat.completions.create(**chat)
    assert (engine.requests[-1].spec, engine.requests[-1].spec_k) == (None, None)
    r = client.chat.completions.create(**chat, extra_body={"speculative": "ngram", "speculative_k": 3})
    assert (engine.requests[-1].spec, engine.requests[-1].spec_k) == ("ngram", 3)
    assert r.usage.completion_tokens_details.accepted_prediction_tokens > 0  # the fake engine's drafts
    client.completions.create(model="my-model", prompt="hi", extra_body={"speculative": "off", "speculative_k": "auto"})
    assert (engine.requests[-1].spec, engine.requests[-1].spec_k) == ("off", 0)
    n = len(engine.requests)
    for body, param in (({"speculative": "medusa"}, "speculative"), ({"speculative": True}, "speculative"),
                        ({"speculative_k": 9}, "speculative_k"), ({"speculative_k": 0}, "speculative_k"),
                        ({"speculative_k": "many"}, "speculative_k")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**chat, extra_body=body)
        assert err.value.body["param"] == param
    assert len(engine.requests) == n


@pytest.mark.parametrize("kind", ["chat", "text"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("logprobs", [None, 2])
def test_text_chunks_from_the_template_equal_the_dict_path(kind, include_usage, logprobs):
    """``piece_sse`` (a template, the text escaped per token) is byte for byte ``sse(piece_chunk)``."""
    from bw24chat.server.protocol import ParsedRequest, Responder, sse
    from bw24chat.api import GenerationRequest

    gen = GenerationRequest(prompt="p") if kind == "text" else GenerationRequest(messages=[{"role": "user", "content": "x"}])
    parsed = ParsedRequest(kind, gen, stream=True, include_usage=include_usage, logprobs=logprobs, n=3)
    r = Responder(parsed, 'my "model"\\ é', "fp")
    texts = ["", " hello", 'quote " backslash \\ slash /', "new\nline\ttab\r", "\x00\x1f\x7f", "é — 漢字 🙂",
             "\u2028\u2029", "\ud7ff\ue000", "</script>"]
    for i in range(3):
        for t in texts:
            assert r.piece_sse(t, i) == sse(r.piece_chunk(t, None, i))


def test_kept_alive_connections_answer_without_delay(served):
    """Responses go out at once (TCP_NODELAY on accepted connections: with Nagle, a response's
    body waited for the client's delayed ACK of its headers, ~40 ms a request)."""
    import statistics
    import time

    _, url = served
    with httpx.Client(base_url=url) as http:
        http.get("/health")
        times = []
        for _ in range(9):
            t0 = time.perf_counter()
            assert http.get("/health").status_code == 200
            times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.02
