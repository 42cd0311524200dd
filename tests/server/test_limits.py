"""Errors, limits, auth, the queue, disconnects and concurrency, against real server processes."""
from __future__ import annotations

import json
import signal
import time

import httpx
import openai
import pytest

from .serverproc import run_concurrently, stream_chat, wait_until

CHAT = "/v1/chat/completions"


def msg(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# ----------------------------------------------------------------------------- bad requests
def test_malformed_json(fake_server):
    for raw in (b'{"model": "fake-model", "messages": [', b"not json", b"\xff\xfe\x00garbage"):
        r = fake_server.http.post(CHAT, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400
        err = error_of(r)
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json"
    r = fake_server.http.post(CHAT, json=[1, 2])
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages.[0].content"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 7}, "temperature"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),  # over --max-tokens-cap
        ({"stop": 3}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"stream": "yes"}, "stream"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs
        ({"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
        ({"n": 17}, "n"),  # over MAX_CHOICES
        ({"n": 0}, "n"),
        ({"n": "1"}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"model": 3}, "model"),
    ],
)
def test_invalid_chat_parameters(fake_server, patch, param):
    body = {"model": "fake-model", "messages": msg("hi"), **patch}
    r = fake_server.http.post(CHAT, json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


@pytest.mark.parametrize(
    "patch, param",
    [({}, "prompt"), ({"prompt": 5}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [[1], [2]]}, "prompt"),
     ({"prompt": [-1, 2]}, "prompt"), ({"prompt": [1, 2.5]}, "prompt"), ({"prompt": [True]}, "prompt"), ({"prompt": []}, "prompt"),
     ({"prompt": [1, 2], "echo": True}, "echo"),
     ({"prompt": "x", "logprobs": True}, "logprobs"), ({"prompt": "x", "echo": 1}, "echo"),
     ({"prompt": "x", "best_of": 3}, "best_of"), ({"prompt": "x", "suffix": "end"}, "suffix")],
)
def test_invalid_completion_parameters(fake_server, patch, param):
    r = fake_server.http.post("/v1/completions", json={"model": "fake-model", **patch})
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param


def test_n_choices_through_client(fake_server):
    r = fake_server.client().chat.completions.create(model="fake-model", messages=msg("hi"), n=3, max_tokens=2)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "You said:" for c in r.choices)
    assert r.usage.completion_tokens == 3 * 2 and r.usage.prompt_tokens == r.usage.total_tokens - 6
    stream = fake_server.client().chat.completions.create(model="fake-model", messages=msg("hi"), n=2, max_tokens=2,
                                                          stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = {0: "", 1: ""}
    finish = {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert text == {0: "You said:", 1: "You said:"} and finish == {0: "length", 1: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:
        fake_server.client().chat.completions.create(model="fake-model", messages=msg("hi"), n=99)
    assert e.value.param == "n"


def test_nulls_mean_defaults(fake_server):
    body = {"model": "fake-model", "messages": msg("hi"), "temperature": None, "stop": None, "max_tokens": None, "n": None}
    r = fake_server.http.post(CHAT, json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "You said: hi"


def test_context_too_long(fake_server):
    r = fake_server.http.post("/v1/completions", json={"model": "fake-model", "prompt": "w " * 5000})
    assert r.status_code == 400
    assert error_of(r)["code"] == "context_length_exceeded"


def test_body_too_large(fake_server):
    big = {"model": "fake-model", "messages": msg("x" * 70_000)}  # the server allows 64 KiB
    r = fake_server.http.post(CHAT, json=big)
    assert r.status_code == 413
    assert error_of(r)["type"] == "invalid_request_error"
    # also when the body arrives in chunks, without a Content-Length
    data = json.dumps(big).encode()
    r = fake_server.http.post(CHAT, content=iter([data[i:i + 8192] for i in range(0, len(data), 8192)]))
    assert r.status_code == 413
    assert fake_server.http.post(CHAT, json={"model": "fake-model", "messages": msg("small")}).status_code == 200


def test_unknown_route_and_method(fake_server):
    r = fake_server.http.get("/v1/nothing")
    assert r.status_code == 404 and "Invalid URL" in error_of(r)["message"]
    r = fake_server.http.get(CHAT)
    assert r.status_code == 405 and error_of(r)


# ----------------------------------------------------------------------------- auth
def test_api_key(start_server):
    server = start_server("--fake", "--fake-echo", "--fake-token-delay", "0", api_key="sekrit")
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").chat.completions.create(model="fake-model", messages=msg("hi"))
    r = httpx.post(server.base_url + CHAT, json={"model": "fake-model", "messages": msg("hi")})
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(server.base_url + "/v1/models").status_code == 401
    assert httpx.get(server.base_url + "/metrics").status_code == 401
    assert httpx.get(server.base_url + "/health").status_code == 200  # health stays open
    ok = server.client(api_key="sekrit").chat.completions.create(model="fake-model", messages=msg("hi"))
    assert ok.choices[0].message.content == "You said: hi"
    assert server.metric("http_requests_total", endpoint=CHAT, status="401") >= 2


# ----------------------------------------------------------------------------- queue, disconnects
LONG = " ".join(f"w{i}" for i in range(200))  # the echo reply takes 200 x 50 ms = 10 s


class OpenStream:
    """A streaming chat read line by line (one line iterator for the whole response: dropping
    an httpx line iterator closes the connection)."""

    def __init__(self, server, content: str):
        self.client = httpx.Client(base_url=server.base_url, timeout=30)
        body = {"model": "fake-model", "messages": msg(content), "stream": True}
        self.resp = self.client.send(self.client.build_request("POST", CHAT, json=body), stream=True)
        assert self.resp.status_code == 200
        self.lines = self.resp.iter_lines()

    def first_content(self) -> str:
        """Wait for the first content chunk (the request is then running in the engine)."""
        for line in self.lines:
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    return delta["content"]
        raise AssertionError("the stream ended without content")

    def close(self) -> None:
        self.resp.close()
        self.client.close()


def test_queue_full_gives_429(slow_server):
    running = OpenStream(slow_server, LONG)
    try:
        assert running.first_content() == "You"  # running now: the engine took it off the queue
        waiting = OpenStream(slow_server, "queued")  # headers sent: it is in the queue
        try:
            assert slow_server.http.get("/health").json()["queue_depth"] == 2
            with pytest.raises(openai.RateLimitError) as e:
                slow_server.client().chat.completions.create(model="fake-model", messages=msg("one too many"))
            retry_after = e.value.response.headers["retry-after"]
            assert retry_after.isdigit() and 1 <= int(retry_after) <= 60
            assert e.value.code == "queue_full"
        finally:
            waiting.close()
    finally:
        running.close()
    wait_until(lambda: slow_server.http.get("/health").json()["queue_depth"] == 0, 10, "the queue to drain")
    r = slow_server.client().chat.completions.create(model="fake-model", messages=msg("after"))
    assert r.choices[0].message.content == "You said: after"


def test_disconnect_cancels_streaming_generation(slow_server):
    before = slow_server.metric("generations_total", finish_reason="cancelled")
    stream = OpenStream(slow_server, LONG)
    assert stream.first_content() == "You"
    t0 = time.monotonic()
    stream.close()
    wait_until(lambda: slow_server.metric("generations_total", finish_reason="cancelled") == before + 1,
               5, "the generation to be cancelled")
    r = slow_server.client().chat.completions.create(model="fake-model", messages=msg("next"))
    assert r.choices[0].message.content == "You said: next"
    assert time.monotonic() - t0 < 5  # far less than the 10 s the abandoned reply would take


def test_disconnect_cancels_non_streaming_generation(slow_server):
    before = slow_server.metric("generations_total", finish_reason="cancelled")
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow_server.base_url + CHAT, json={"model": "fake-model", "messages": msg(LONG)}, timeout=0.5)
    wait_until(lambda: slow_server.metric("generations_total", finish_reason="cancelled") == before + 1,
               5, "the generation to be cancelled")
    assert time.monotonic() - t0 < 5
    wait_until(lambda: slow_server.metric("http_requests_total", endpoint=CHAT, status="499") >= 1,
               5, "the abandoned request to be counted")


# ----------------------------------------------------------------------------- concurrency
def test_concurrent_clients_get_their_own_streams(fake_server):
    client = fake_server.client()
    prompts = [" ".join(f"client{i}-word{j}" for j in range(20)) for i in range(16)]
    texts = run_concurrently(lambda p: stream_chat(client, p), prompts, timeout=60)
    assert texts == ["You said: " + p for p in prompts]


def test_metrics(fake_server):
    fake_server.client().chat.completions.create(model="fake-model", messages=msg("count me"))
    text = fake_server.metrics()
    for name in ("bw24chat_http_requests_total", "bw24chat_prompt_tokens_total", "bw24chat_generated_tokens_total",
                 "bw24chat_decode_tokens_per_second", "bw24chat_queue_depth", "bw24chat_vram_used_bytes",
                 "bw24chat_vram_total_bytes"):
        assert f"# TYPE {name} " in text, name
    assert fake_server.metric("http_requests_total", endpoint=CHAT, status="200") >= 1
    assert fake_server.metric("generated_tokens_total") >= 3
    assert fake_server.metric("vram_total_bytes") == 24 * 2**30
    assert fake_server.metric("queue_depth") == 0


def test_sigint_stops_cleanly(start_server):
    server = start_server("--fake")
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=10) == 0
