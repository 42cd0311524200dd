"""The editing workload (`bw24chat bench --spec ngram`'s request: a paragraph, then a request to
repeat it with small changes) sent to a running OpenAI-compatible server, greedy, to compare
another engine's speculative decoding with ours on the same GPU and GGUF, e.g. llama.cpp's

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf -ngl 99 -np 1 [--spec-type ngram-simple ...]
    python tools/edit_request.py --url http://127.0.0.1:8080 [--runs 5] [--max-tokens 160]

Prints the median decode rate (the server's own ``timings.predicted_per_second`` where it reports
one, as llama-server does, else completion tokens over wall time), the draft counts it reports,
and the reply's sha256, so that two servers' (or two settings') outputs can be compared.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def once(http: httpx.Client, model: str, max_tokens: int) -> dict:
    from bw24chat.bench import edit_messages

    body = {"model": model, "messages": edit_messages(), "max_tokens": max_tokens, "temperature": 0, "stream": False}
    t0 = time.perf_counter()
    r = http.post("/v1/chat/completions", json=body)
    wall = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
    d = r.json()
    text, n = d["choices"][0]["message"]["content"], d["usage"]["completion_tokens"]
    t = d.get("timings") or {}
    return dict(tokens=n, tok_s=t.get("predicted_per_second") or n / wall, draft=t.get("draft_n"),
                accepted=t.get("draft_n_accepted"), sha=hashlib.sha256(text.encode()).hexdigest()[:16])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("-m", "--model", default="default")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    with httpx.Client(base_url=a.url, timeout=600) as http:
        once(http, a.model, 8)  # warm-up
        done = [once(http, a.model, a.max_tokens) for _ in range(a.runs)]
    tps = statistics.median(d["tok_s"] for d in done)
    print(json.dumps(dict(url=a.url, tok_s=round(tps, 1), tokens=done[0]["tokens"], draft=done[0]["draft"],
                          accepted=done[0]["accepted"], sha256=done[0]["sha"],
                          same_reply=len({d["sha"] for d in done}) == 1)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
