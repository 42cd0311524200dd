"""The server under abuse, on 127.0.0.1 with the fake engine, bounded in count and time:
slowloris clients, oversized headers, bodies that never finish, SSE clients that vanish, a
thousand invalid requests.  The server stays up, its memory stays flat, and every answer the
app gives is an OpenAI-style error."""
from __future__ import annotations

import random
import socket
import time

import httpx
import pytest

from bw24chat.fake_engine import FakeEngine
from bw24chat.server import app as server_app
from bw24chat.server import start_in_thread

from .serverproc import wait_until
from .test_limits import CHAT, error_of, msg


@pytest.fixture
def quick_server(monkeypatch):
    """A server in a thread with 1-second head and body deadlines."""
    monkeypatch.setattr(server_app, "HEAD_TIMEOUT_S", 1.0)
    monkeypatch.setattr(server_app, "BODY_TIMEOUT_S", 1.0)
    engine = FakeEngine(token_delay=0)
    server, thread = start_in_thread(engine, port=0)
    yield server.url
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()


def _port(url: str) -> int:
    return httpx.URL(url).port


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``seconds`` (None: still open)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except socket.timeout:
        return None
    return got


def test_slowloris_connections_are_closed(quick_server):
    port = _port(quick_server)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    for s in socks:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    assert httpx.get(quick_server + "/health").status_code == 200  # others are served meanwhile
    idle = socket.create_connection(("127.0.0.1", port))  # sends nothing at all
    assert all(_closed_within(s, 5) is not None for s in socks + [idle])


def test_a_body_that_never_finishes_gets_408(quick_server):
    s = socket.create_connection(("127.0.0.1", _port(quick_server)))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"model\": ")
    answer = _closed_within(s, 5)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")


@pytest.mark.parametrize("headers", [{"X-Big": "a" * 40_000}, {f"X-H{i}": "v" for i in range(150)}])
def test_oversized_headers_get_431(fake_server, headers):
    r = httpx.post(fake_server.base_url + CHAT, json={"model": "fake-model", "messages": msg("hi")}, headers=headers)
    assert r.status_code == 431 and error_of(r)["code"] == "headers_too_large"


def test_a_huge_header_block_is_cut_off_by_the_http_layer(fake_server):
    s = socket.create_connection(("127.0.0.1", _port(fake_server.base_url)))
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000)  # never terminated
        answer = _closed_within(s, 10)
        assert answer is not None and answer.startswith(b"HTTP/1.1 4")
    except ConnectionResetError:
        pass  # h11 gave up on the head and closed with our bytes unread: a reset is as good
    assert fake_server.http.get("/health").status_code == 200


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_thousand_invalid_requests_leave_the_server_up_with_flat_memory(fake_server):
    rng = random.Random(5)
    bad = [
        lambda: fake_server.http.post(CHAT, content=b'{"model": "fake-model", "messages": [', headers={"content-type": "application/json"}),
        lambda: fake_server.http.post(CHAT, content=bytes(rng.randrange(256) for _ in range(200))),
        lambda: fake_server.http.post(CHAT, json={"model": "fake-model", "messages": msg("x"), "temperature": rng.choice([-1, 9, "hot", []])}),
        lambda: fake_server.http.post(CHAT, json={"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}),
        lambda: fake_server.http.post(CHAT, json={"model": "fake-model", "messages": msg("x"), "max_tokens": rng.choice([0, -5, 10**9, "8"])}),
        lambda: fake_server.http.post(CHAT, json={"model": "fake-model", "messages": msg("x"), "stop": [1, 2]}),
        lambda: fake_server.http.post(CHAT, json=[1, 2, 3]),
        lambda: fake_server.http.post(CHAT, content=b"x" * 70_000),  # over the test server's 64 KiB limit
        lambda: fake_server.http.post("/v1/completions", json={"model": "fake-model", "prompt": [1, -2]}),
        lambda: fake_server.http.get("/v1/nowhere"),
        lambda: fake_server.http.delete(CHAT),
    ]
    for _ in range(100):  # warm up: caches, lazily built objects
        rng.choice(bad)()
    before = _rss_kib(fake_server.proc.pid)
    statuses = set()
    for _ in range(1000):
        r = rng.choice(bad)()
        assert 400 <= r.status_code < 500, r.text
        error_of(r)  # OpenAI's error shape, every time
        statuses.add(r.status_code)
    grown = _rss_kib(fake_server.proc.pid) - before
    assert grown < 8 * 1024, f"the server grew by {grown} KiB over 1000 invalid requests"
    assert statuses >= {400, 404, 405, 413}
    assert fake_server.client().chat.completions.create(model="fake-model", messages=msg("still here")).choices[0].message.content \
        == "You said: still here"


def test_sse_clients_that_vanish_mid_stream(slow_server):
    before = slow_server.metric("generations_total", finish_reason="cancelled")
    for _ in range(5):
        with httpx.stream("POST", slow_server.base_url + CHAT, timeout=10,
                          json={"model": "fake-model", "messages": msg("a b c d e f g h i j k l"), "stream": True}) as r:
            next(r.iter_lines())  # the first chunk, then the client is gone
        wait_until(lambda: slow_server.http.get("/health").json()["queue_depth"] == 0, 10, "the queue to drain")
    wait_until(lambda: slow_server.metric("generations_total", finish_reason="cancelled") >= before + 5, 10,
               "every abandoned stream to be cancelled")
    t0 = time.monotonic()
    assert slow_server.client().chat.completions.create(model="fake-model", messages=msg("next")).choices[0].message.content \
        == "You said: next"
    assert time.monotonic() - t0 < 5


def test_loopback_by_default_and_a_constant_time_key_check():
    import inspect

    from bw24chat.server.app import _FrontDoor, serve

    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert "hmac.compare_digest" in inspect.getsource(_FrontDoor._authorized)
