"""The host cost of serving a token: `bw24chat serve`'s whole per-token path with the model's compute
taken out.

The real engine (engine.Engine), its scheduler (scheduler.py), the real tokenizer's streaming
detokenization (generate.Output) and the real server app (server/app.py, uvicorn) run in this
process; only the runner is replaced by one whose ``batch_step`` returns at once (or after
``--step-ms``, the GIL released as a GPU wait releases it), each sequence "sampling" the tokens of
an English text in turn.  What is left is what a GPU cannot speed up: the scheduler's per-step
Python, detokenization and stop strings, the hop from the engine thread to the event loop, the
OpenAI chunks, Starlette and uvicorn.

The clients run in a child process (httpx, one thread a stream; streaming requests ask for
``stream_options.include_usage`` and count the usage's completion tokens), so their parsing is
not charged to the server.  For 1 and N streaming clients and N non-streaming ones it prints the
aggregate tokens/s and the server process's CPU time per token (all its threads; split into the
engine thread and the event loop's thread).  With an instant runner, everything the server does
holds one GIL, so aggregate tokens/s is about 1e6 / (host us per token): that rate is the ceiling
a GPU, however fast, can reach through this server.

    python tools/serve_overhead.py [-m MODEL] [--streams 8] [--max-tokens 256] [--runs 3] [--step-ms 0]

MODEL (default: the default model) gives the tokenizer and the chat template only; no weight is
read by the runner.  To see where the time goes, run it under a sampling profiler that follows
every thread (``py-spy record --threads -o out.svg -- python tools/serve_overhead.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

TEXT = (
    "The sea was calm that morning, and the old lighthouse keeper walked down to the harbour "
    "before dawn. He counted the boats (twelve, as always) and wrote the number in his notebook: "
    "\"12 boats, wind from the north-east, 7 knots.\" Nobody had asked him to keep these notes; "
    "he kept them because his father had, and his father's father before him. Café owners on the "
    "quay waved — some of them had known him for 40 years — and the gulls circled overhead.\n\n"
    "```python\nfor boat in harbour.boats():\n    print(f\"{boat.name}: {boat.crew} crew\")\n```\n\n"
    "- point one: the tide turns at 06:42;\n- point two: the ferry is late again.\n\n"
)


class InstantRunner:
    """The runner interface's batched part (backends/runner.py) with no model: every sampled row
    gives the next token of ``tokens`` at that position.  ``step_s``: how long a step waits
    (time.sleep releases the GIL, as waiting for a GPU does)."""

    def __init__(self, tokens: list[int], vocab_size: int, n_ctx: int = 4096, batch: int = 8, step_s: float = 0.0):
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.n_ctx = n_ctx
        self.max_batch = batch
        self.block_size = 16
        self.step_s = step_s
        self._rows = 1

    def kv_block_bytes(self) -> int:
        return self.block_size * 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16

    def init_kv_pool(self, n_blocks: int) -> None:
        pass

    def batch_step(self, work) -> list[list[int]]:
        if self.step_s:
            time.sleep(self.step_s)
        out, t, n = [], self.tokens, len(self.tokens)
        rows = 0
        for w in work:
            end = w.start + len(w.ids)
            if w.params is None:
                out.append([])
            elif w.sample_all:
                out.append([t[p % n] for p in range(w.start + 1, end + 1)])
            else:
                out.append([t[end % n]])
            rows += len(out[-1])
        self._rows = max(rows, 1)
        return out

    def last_logits(self) -> np.ndarray:
        return np.zeros((self._rows, self.vocab_size), np.float32)

    def rollback(self, n: int) -> None:
        pass

    def memory_info(self) -> dict:
        return {}


def _task_cpu(tid: int) -> float:
    """A thread's CPU seconds (user + system) from /proc."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- the clients (child process)
def _client(http, model: str, i: int, max_tokens: int, stream: bool, out: list) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": f"Write a long story number {i} about the sea."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        r = http.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        out.append(r.json()["usage"]["completion_tokens"])
        return
    body["stream_options"] = {"include_usage": True}
    tail = b""
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for chunk in r.iter_raw():  # only the last events are read: the client's parsing stays cheap
            tail = (tail + chunk)[-4096:]
    events = tail.split(b"\n\n")
    if events[-2] != b"data: [DONE]":
        raise RuntimeError(f"the stream did not end with [DONE]: {tail[-200:]!r}")
    out.append(json.loads(events[-3][6:])["usage"]["completion_tokens"])


def client_main(url: str, model: str, streams: int, requests: int, max_tokens: int, stream: bool) -> None:
    """``streams`` threads, each sending ``requests`` requests one after the other on its own
    connection (opened, with a first request, before the clock starts)."""
    import httpx

    res: list = []
    clients = [httpx.Client(base_url=url, timeout=600) for _ in range(streams)]
    for http in clients:
        _client(http, model, 0, 1, stream, [])

    def work(i: int) -> None:
        for k in range(requests):
            _client(clients[i], model, i * requests + k, max_tokens, stream, res)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(streams)]
    print("ready", flush=True)
    sys.stdin.readline()  # the server has read its clocks
    t0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"tokens": sum(res), "ok": len(res), "wall_s": time.perf_counter() - t0,
                      "client_cpu_s": time.process_time() - c0}))


# ----------------------------------------------------------------------------- the server (this process)
def _one_run(url: str, model: str, streams: int, requests: int, max_tokens: int, stream: bool, threads: dict) -> dict:
    """One child process of clients; the server's clocks are read once the child has opened its
    connections (its start-up is not counted)."""
    child = subprocess.Popen([sys.executable, __file__, "--client", url, "--model-id", model, "--streams", str(streams),
                              "--requests", str(requests), "--max-tokens", str(max_tokens)] + ([] if stream else ["--whole"]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise SystemExit(f"the clients failed:\n{child.stderr.read()[-3000:]}")
    cpu0 = time.process_time()
    t0 = {k: _task_cpu(tid) for k, tid in threads.items()}
    out, err = child.communicate("go\n")
    cpu = time.process_time() - cpu0
    split = {k: _task_cpu(tid) - t0[k] for k, tid in threads.items()}
    if child.returncode != 0:
        raise SystemExit(f"the clients failed:\n{err[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    if r["ok"] != streams * requests:
        raise SystemExit(f"{streams * requests - r['ok']} of {streams * requests} requests failed:\n{err[-3000:]}")
    n = r["tokens"]
    return {"tok_s": n / r["wall_s"], "us_tok": 1e6 * cpu / n, **{f"us_tok_{k}": 1e6 * v / n for k, v in split.items()},
            "client_us_tok": 1e6 * r["client_cpu_s"] / n, "tokens": n}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="the model whose tokenizer and chat template serve (default: the default model)")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=4, help="requests each of the N clients sends in a run (one client: N times as many)")
    p.add_argument("--runs", type=int, default=3, help="runs per case after a warm-up; the median is printed")
    p.add_argument("--step-ms", type=float, default=0.0, help="time a batched step waits (0: instant)")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-id", default=None, help=argparse.SUPPRESS)
    p.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.client:
        client_main(a.client, a.model_id, a.streams, a.requests, a.max_tokens, not a.whole)
        return 0

    from bw24chat.engine import Engine
    from bw24chat.loaders import load_checkpoint
    from bw24chat.model_store import resolve_model
    from bw24chat.server.app import start_in_thread

    ckpt = load_checkpoint(resolve_model(a.model))
    tok = ckpt.tokenizer
    tokens = [t for t in tok.encode(TEXT, add_bos=False) if t not in tok.stop_ids]
    runner = InstantRunner(tokens, tok.vocab_size, batch=max(a.streams, 1), step_s=a.step_ms / 1e3)
    engine = Engine(ckpt, runner, "cpu", "instant runner", "")
    assert engine.batched
    server, thread = start_in_thread(engine)
    threads = {"engine": engine._thread.native_id, "loop": thread.native_id}
    model = engine.info.model_id
    cases = [("stream", 1, a.streams * a.requests, True), ("stream", a.streams, a.requests, True),
             ("whole", a.streams, a.requests, False)]
    rows = []
    try:
        for kind, n, requests, stream in cases:
            _one_run(server.url, model, n, requests, a.max_tokens, stream, threads)  # warm-up
            runs = [_one_run(server.url, model, n, requests, a.max_tokens, stream, threads) for _ in range(a.runs)]
            rows.append((kind, n, {k: statistics.median(r[k] for r in runs) for k in runs[0]}))
    finally:
        server.should_exit = True
        thread.join()
        engine.close()
    print(f"{ckpt.name}'s tokenizer, instant runner (step {a.step_ms:g} ms), {a.max_tokens} tokens a request, "
          f"{a.streams * a.requests} requests a run, "
          f"median of {a.runs}; CPU: {_cpu_name()}, {os.cpu_count()} cores")
    print(f"{'case':>8} {'clients':>7} {'tok/s':>9} {'host us/tok':>11} {'engine':>7} {'loop':>7} {'client us/tok':>13}")
    for kind, n, r in rows:
        print(f"{kind:>8} {n:7d} {r['tok_s']:9.0f} {r['us_tok']:11.1f} {r['us_tok_engine']:7.1f} {r['us_tok_loop']:7.1f} "
              f"{r['client_us_tok']:13.1f}")
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
