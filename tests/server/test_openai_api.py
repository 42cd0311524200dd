"""The OpenAI API through the official client, against a real server process (fake engine)."""
from __future__ import annotations

import json

import openai
import pytest

from bw24chat.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def counter():
    """The fake engine's own prompt rendering and token counting, to check usage against."""
    fe = FakeEngine()
    yield fe
    fe.close()


def chat_prompt_tokens(counter, messages):
    return counter.count_tokens(counter.render_prompt(messages))


def ask(client, content, **kw):
    return client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": content}], **kw)


def test_health_and_models(fake_server):
    assert fake_server.http.get("/health").json()["status"] == "ok"
    client = fake_server.client()
    ids = [m.id for m in client.models.list()]
    assert ids == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert e.value.code == "model_not_found"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_unknown_model_is_not_found(fake_server, path):
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    r = fake_server.http.post(path, json=body)
    assert r.status_code == 404
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("model_not_found", "model") and "fake-model" in err["message"]


def test_chat_non_streaming(fake_server, counter):
    r = ask(fake_server.client(), "hello world")
    assert r.object == "chat.completion"
    assert r.model == "fake-model"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "You said: hello world"
    assert choice.finish_reason == "stop"
    msgs = [{"role": "user", "content": "hello world"}]
    assert r.usage.prompt_tokens == chat_prompt_tokens(counter, msgs)
    assert r.usage.completion_tokens == counter.count_tokens("You said: hello world") == 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming(fake_server, counter):
    stream = ask(fake_server.client(), "stream me please", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and not first.delta.content
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 4  # streamed word by word
    text = "".join(c.choices[0].delta.content for c in content_chunks)
    assert text == "You said: stream me please"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the include_usage chunk comes last
    assert all(c.usage is None for c in chunks[:-1])
    msgs = [{"role": "user", "content": "stream me please"}]
    assert chunks[-1].usage.prompt_tokens == chat_prompt_tokens(counter, msgs)
    assert chunks[-1].usage.completion_tokens == 5


def test_streaming_without_usage_and_raw_sse(fake_server):
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "raw"}], "stream": True}
    with fake_server.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"][0]["delta"] == {}


def test_content_parts_and_roles(fake_server):
    r = fake_server.client().chat.completions.create(
        model="fake-model",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]},
        ],
    )
    assert r.choices[0].message.content == "You said: two parts"


def test_completions(fake_server, counter):
    client = fake_server.client()
    r = client.completions.create(model="fake-model", prompt="The sky is")
    assert r.object == "text_completion"
    assert r.choices[0].text == "You said: The sky is"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == counter.count_tokens("The sky is") == 3
    assert r.usage.completion_tokens == 5

    streamed = list(client.completions.create(model="fake-model", prompt="The sky is", stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "stop"
    assert streamed[-1].usage.completion_tokens == 5

    ids = client.completions.create(model="fake-model", prompt=[5, 6, 7])  # a token-array prompt, as is
    assert ids.choices[0].text == "You said: 5 6 7" and ids.usage.prompt_tokens == 3

    echoed = client.completions.create(model="fake-model", prompt="Echo", echo=True)
    assert echoed.choices[0].text == "EchoYou said: Echo"
    streamed = list(client.completions.create(model="fake-model", prompt="Echo", echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "EchoYou said: Echo"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(fake_server, stream):
    client = fake_server.client()

    def text(**kw):
        r = ask(client, "alpha beta gamma", stream=stream, **kw)
        if not stream:
            return r.choices[0].message.content, r.choices[0].finish_reason
        chunks = list(r)
        return ("".join(c.choices[0].delta.content or "" for c in chunks),
                [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason][0])

    assert text(stop="beta") == ("You said: alpha ", "stop")
    assert text(stop=["gamma", " alpha"]) == ("You said:", "stop")
    assert text(stop=["not there"]) == ("You said: alpha beta gamma", "stop")
    r = client.completions.create(model="fake-model", prompt="one two three", stop=" two")
    assert r.choices[0].text == "You said: one"


def test_max_tokens(fake_server):
    client = fake_server.client()
    r = ask(client, "a b c d e f", max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    assert r.choices[0].message.content == "You said: a"
    r = ask(client, "a b c d e f", max_completion_tokens=2)
    assert r.usage.completion_tokens == 2
    r = client.completions.create(model="fake-model", prompt="a b c", max_tokens=1)
    assert r.choices[0].text == "You" and r.choices[0].finish_reason == "length"


def test_seed_reproducible(fake_server):
    client = fake_server.client()
    kw = dict(temperature=1.0, top_p=0.9, seed=1234, max_tokens=6,
              extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})
    a = ask(client, "pick a word", **kw).choices[0].message.content
    b = ask(client, "pick a word", **kw).choices[0].message.content
    assert a == b and a


def test_chat_logprobs(fake_server):
    client = fake_server.client()
    r = ask(client, "log me", logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token

    only_chosen = ask(client, "log me", logprobs=True)
    assert all(t.top_logprobs == [] for t in only_chosen.choices[0].logprobs.content)
    assert ask(client, "log me").choices[0].logprobs is None

    chunks = list(ask(client, "log me", logprobs=True, top_logprobs=1, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_completion_logprobs(fake_server):
    r = fake_server.client().completions.create(model="fake-model", prompt="x y", logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == "You said: x y"
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == len("x y")  # after the echoed prompt
    text = r.choices[0].text
    assert all(text[off:off + len(tok)] == tok for off, tok in zip(lp.text_offset, lp.tokens))


def test_engine_failure(fake_server):
    client = fake_server.client()
    with pytest.raises(openai.InternalServerError) as e:
        ask(client, "please [[error]] now")
    assert "fake engine failure" in e.value.message
    with pytest.raises(openai.APIError, match="fake engine failure"):
        for _ in ask(client, "please [[error]] now", stream=True):
            pass
    assert ask(client, "fine again").choices[0].message.content == "You said: fine again"
