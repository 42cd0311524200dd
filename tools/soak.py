"""Long-run check of the engine and the server: nothing grows but the KV cache
in use, nothing slows down.

    python tools/soak.py engine -m MODEL [--device cuda] [--generations 1000] [--out engine.json]
    python tools/soak.py server -m MODEL [--device cuda] [--minutes 5] [--clients 8] [--out server.json]

``engine``: generations of mixed lengths (prompts of 1-300 words, 1-256 new tokens, a fixed
seed) back to back through the engine API.  ``server``: the OpenAI server in this process on
127.0.0.1, ``--clients`` threads streaming chat completions for ``--minutes``.  Both record at
the start and the end (first and last tenth of the run): host RSS, device memory used (CUDA),
decode tokens/s; the JSON has the figures and every sample.  Each command is meant to finish
within ten minutes on the GPU machine (lower --generations / --minutes where it would not).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bw24chat.api import DoneEvent, GenerationRequest, SamplingParams  # noqa: E402
from bw24chat.engine import open_engine  # noqa: E402
from bw24chat.options import EngineOptions  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def sample(engine, decode_tps: float | None) -> dict:
    s = engine.stats()
    return {"t": time.time(), "rss": rss_bytes(), "vram_used": s.get("vram_used"), "ctx_used": s.get("ctx_used"),
            "decode_tps": decode_tps}


def summary(samples: list[dict]) -> dict:
    """Medians over the first and the last tenth of the samples, and their change."""
    k = max(len(samples) // 10, 1)
    out = {}
    for key in ("rss", "vram_used", "decode_tps"):
        head = [s[key] for s in samples[:k] if s[key] is not None]
        tail = [s[key] for s in samples[-k:] if s[key] is not None]
        if head and tail:
            a, b = statistics.median(head), statistics.median(tail)
            out[key] = {"start": a, "end": b, "change": b - a, "ratio": b / a if a else None}
    return out


def soak_engine(engine, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 300)))
        params = SamplingParams(temperature=0.7, seed=seed + i, max_tokens=rng.randint(1, 256))
        final = None
        for ev in engine.submit(GenerationRequest(messages=[{"role": "user", "content": prompt}], sampling=params)).events():
            final = ev
        tps = final.stats.get("decode_tps") if isinstance(final, DoneEvent) else None
        samples.append(sample(engine, tps))
        if (i + 1) % max(n // 20, 1) == 0:
            print(f"{i + 1}/{n} generations, rss {samples[-1]['rss'] / 2**20:.0f} MiB, decode {tps or 0:.1f} tok/s", file=sys.stderr)
    return samples


def soak_server(engine, minutes: float, clients: int) -> list[dict]:
    import httpx

    from bw24chat.server import start_in_thread

    server, thread = start_in_thread(engine, port=0)
    end = time.monotonic() + minutes * 60
    samples, errors, lock = [], [], threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=server.url, timeout=120) as http:
            while time.monotonic() < end:
                body = {"model": engine.info.model_id, "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 100)))}],
                        "max_tokens": rng.randint(1, 128), "seed": rng.randrange(1 << 30)}
                t0 = time.monotonic()
                r = http.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    with lock:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                    continue
                n = r.json()["usage"]["completion_tokens"]
                with lock:
                    samples.append(dict(sample(engine, None), client_tps=n / (time.monotonic() - t0)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.should_exit = True
    thread.join(timeout=10)
    if errors:
        print(f"{len(errors)} failed requests, e.g. {errors[0]}", file=sys.stderr)
    for s in samples:
        s["decode_tps"] = s.pop("client_tps")  # per-request tokens/s as the clients see it, queueing included
    return samples[clients:]  # from when the queue is full: the first requests found it empty


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["engine", "server"])
    p.add_argument("-m", "--model", default=None, help="the model (default: the default model)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--generations", type=int, default=1000)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    engine = open_engine(EngineOptions(model=a.model, device=a.device, max_queue=max(64, a.clients * 2)))
    try:
        t0 = time.time()
        samples = soak_engine(engine, a.generations, a.seed) if a.what == "engine" else soak_server(engine, a.minutes, a.clients)
        report = {"what": a.what, "model": engine.info.name, "backend": engine.info.backend, "device": engine.info.device_name,
                  "seconds": round(time.time() - t0, 1), "requests": len(samples), "summary": summary(samples),
                  "samples": samples}
    finally:
        engine.close()
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
