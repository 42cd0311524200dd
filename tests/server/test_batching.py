"""The server on a batching engine (a random-weight model on the NumPy backend): concurrent
requests decode together and each gets what it gets alone, ``n`` choices, and the queue, batch
and per-request figures in /metrics."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.check import SPEC_SHAPE, word_tokenizer
from bw24chat.engine import Engine
from bw24chat.server import start_in_thread
from bw24chat.synthetic import synthetic_checkpoint

V = SPEC_SHAPE["vocab_size"]
SYSTEM = " ".join(f"w{(7 * i) % V}" for i in range(40))  # a shared prefix of 40 words
PROMPTS = [SYSTEM + " " + " ".join(f"w{(i * 31 + j) % V}" for j in range(3 + i)) for i in range(8)]


@pytest.fixture(scope="module")
def served():
    ck = synthetic_checkpoint(SPEC_SHAPE, "Q8_0")
    ck.tokenizer = word_tokenizer(V)
    engine = Engine(ck, numpy_runner(ck, 512), "cpu", "CPU (NumPy)", "test")
    assert engine.batched
    server, thread = start_in_thread(engine, port=0)
    try:
        yield engine, httpx.Client(base_url=server.url, timeout=120)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.close()


def _complete(http, prompt, **kw):
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.9, "seed": 5}],
                         ids=["greedy", "seeded"])
def test_concurrent_requests_equal_their_solo_runs(served, sampling):
    engine, http = served
    alone = [_complete(http, p, **sampling)["choices"][0]["text"] for p in PROMPTS]
    steps = engine.stats()["batch_steps"]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _complete(http, p, **sampling)["choices"][0]["text"], PROMPTS))
    assert together == alone
    # decoded together: far fewer steps than one request at a time would take
    assert engine.stats()["batch_steps"] - steps < 8 * 12


def test_n_choices_follow_the_seeds(served):
    _, http = served
    prompt = PROMPTS[0]
    many = _complete(http, prompt, n=3, temperature=0.9, seed=40)
    singles = [_complete(http, prompt, temperature=0.9, seed=40 + i)["choices"][0]["text"] for i in range(3)]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert [c["text"] for c in many["choices"]] == singles
    u = many["usage"]
    assert u["completion_tokens"] == 3 * 12 and u["total_tokens"] == u["prompt_tokens"] + 36


def test_metrics_show_the_batch_and_each_request(served):
    engine, http = served
    _complete(http, PROMPTS[1], temperature=0)
    _complete(http, PROMPTS[2], temperature=0)
    text = http.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            values[name] = float(v)
    for name in ("requests_running", "requests_waiting", "batch_size", "batch_max", "kv_blocks_total", "kv_blocks_used",
                 "kv_blocks_cached", "batch_steps_total", "prefix_cache_hit_tokens_total", "preemptions_total"):
        assert f"bw24chat_{name}" in values, name
    assert values["bw24chat_batch_max"] > 1 and values["bw24chat_prefix_cache_hit_tokens_total"] >= 32
    n = values["bw24chat_request_prompt_tokens_count"]
    assert n >= 2 and values['bw24chat_request_prompt_tokens_bucket{le="+Inf"}'] == n
    assert values["bw24chat_request_generation_tokens_sum"] >= 24
    assert values["bw24chat_time_to_first_token_seconds_count"] >= 2
    assert values["bw24chat_request_queue_time_seconds_count"] >= 2


def test_a_client_that_leaves_frees_its_blocks(served):
    engine, http = served
    with http.stream("POST", "/v1/completions", json={"prompt": PROMPTS[3], "max_tokens": 400, "stream": True,
                                                       "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # leave mid-stream
    deadline = time.monotonic() + 30
    while engine.stats()["kv_blocks_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["kv_blocks_used"] == 0 and engine.queue_depth() == 0
