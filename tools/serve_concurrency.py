"""Tokens/s of 1 vs N concurrent streaming clients against `bw24chat serve` (in-process server,
real engine): the aggregate rate and each stream's rate, the median of --runs runs after a warm-up
at each stream count.  Concurrent requests decode together in the engine's batched step.

    python tools/serve_concurrency.py -m MODEL [--device cuda] [--streams 8] [--max-tokens 128]
    python tools/serve_concurrency.py --url http://127.0.0.1:8080 -m NAME   # another OpenAI-compatible
        server, e.g. llama.cpp's `llama-server -np 8` on the same GPU and GGUF, for comparison

Every request asks for exactly --max-tokens tokens (``ignore_eos``, which bw24chat serve and
llama-server both take), so the servers compared decode the same count.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx


def one_stream(http: httpx.Client, model: str, i: int, max_tokens: int, out: list) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": f"Write a long story number {i} about the sea."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}
    t0 = time.perf_counter()
    first = None
    n = 0
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream {i}: HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if '"usage":{' in line.replace(" ", ""):
                    import json

                    u = json.loads(line[6:]).get("usage")
                    if u:
                        n = u["completion_tokens"]
                elif first is None and '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                    first = time.perf_counter()
    out.append(dict(tokens=n, seconds=time.perf_counter() - t0, ttft=(first or t0) - t0))


def run(url: str, model: str, streams: int, max_tokens: int) -> dict:
    res: list = []
    # a client per stream made before the clock starts: each httpx.Client builds an SSL context
    # (~20 ms of CPU), which would run in this process, beside the server, inside the measurement
    clients = [httpx.Client(base_url=url, timeout=600) for _ in range(streams)]
    threads = [threading.Thread(target=one_stream, args=(clients[i], model, i, max_tokens, res)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for http in clients:
        http.close()
    if len(res) != streams:
        raise SystemExit(f"{streams - len(res)} of {streams} streams failed (their errors are above)")
    toks = sum(r["tokens"] for r in res)
    return dict(streams=streams, tokens=toks, wall_s=wall, aggregate_tok_s=toks / wall,
                median_stream_tok_s=statistics.median(r["tokens"] / r["seconds"] for r in res),
                max_ttft_s=max(r["ttft"] for r in res))


def rows_for(url: str, model: str, streams: int, max_tokens: int, runs: int) -> list[dict]:
    rows = []
    for n in (1, streams):
        run(url, model, n, 8)  # warm-up: this row count's kernels compiled, its step captured
        done = sorted((run(url, model, n, max_tokens) for _ in range(runs)), key=lambda r: r["aggregate_tok_s"])
        rows.append(done[len(done) // 2])  # the median run by aggregate rate
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model", required=True, help="the model to load (with --url: the name to request)")
    p.add_argument("--url", help="a running OpenAI-compatible server to measure instead of an in-process bw24chat serve")
    p.add_argument("--device", default="auto")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=5, help="runs per stream count; the median is reported")
    a = p.parse_args()
    if a.url:
        rows = rows_for(a.url, a.model, a.streams, a.max_tokens, a.runs)
        print(f"{a.model} at {a.url}")
    else:
        from bw24chat.engine import open_engine
        from bw24chat.options import EngineOptions
        from bw24chat.server.app import start_in_thread

        engine = open_engine(EngineOptions(model=a.model, device=a.device))
        server, thread = start_in_thread(engine)
        try:
            rows = rows_for(server.url, engine.info.model_id, a.streams, a.max_tokens, a.runs)
        finally:
            server.should_exit = True
            thread.join()
            engine.close()
        print(f"{engine.info.name} on {engine.info.device_name} ({engine.info.backend})")
    print(f"{'streams':>7} {'tokens':>7} {'wall s':>8} {'aggregate tok/s':>16} {'per-stream tok/s':>17} {'max TTFT s':>11}")
    for r in rows:
        print(f"{r['streams']:7d} {r['tokens']:7d} {r['wall_s']:8.2f} {r['aggregate_tok_s']:16.1f} {r['median_stream_tok_s']:17.1f} {r['max_ttft_s']:11.2f}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
