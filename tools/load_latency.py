"""Latency under load through the real engine (scheduler, batched step, streaming): N background
requests of P-token prompts arriving at random (a Poisson process of --rate a second) and one
interactive request (the TUI's: GenerationRequest.interactive) submitted while they run.

Reported: the background requests' time to first token (p50 / p99) and decode rates, the
aggregate tokens/s while the load runs, and the interactive request's inter-token latency (p50 /
p99) under load against the same request alone on the same engine (the product's bar: p99 under
load < 2x alone).  Prompts are random token ids (GenerationRequest.prompt_ids), distinct per
request, so no prefix is shared; the replies run to --max-tokens (random weights seldom stop).

    python tools/load_latency.py --synthetic qwen3-8b --weights q8_0 --device cuda [--streams 32]
        [--prompt-tokens 512] [--max-tokens 128] [--rate 8] [--json out.json]
    python tools/load_latency.py -m MODEL ...
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from bw24chat.api import DoneEvent, ErrorEvent, GenerationRequest, SamplingParams, TokenEvent


class Timed:
    """One request's event times (engine thread): submission, each token event, the end."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tokens: list[float] = []
        self.n_tokens = 0
        self.final = None
        self.done = threading.Event()

    def __call__(self, ev) -> None:
        if isinstance(ev, TokenEvent) and ev.token_ids:
            self.tokens.append(time.perf_counter())
            self.n_tokens += len(ev.token_ids)
        elif isinstance(ev, (DoneEvent, ErrorEvent)):
            self.final = ev
            self.done.set()

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.t0

    @property
    def gaps(self) -> np.ndarray:
        return np.diff(self.tokens)


def submit(engine, ids: list[int], max_tokens: int, interactive: bool = False) -> Timed:
    t = Timed()
    sp = SamplingParams(temperature=0, max_tokens=max_tokens)
    engine.submit(GenerationRequest(prompt_ids=ids, sampling=sp, interactive=interactive), on_event=t)
    return t


def _pct(x, q) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def run(engine, streams: int, prompt_tokens: int, max_tokens: int, rate: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    V = engine.runner.vocab_size
    prompt = lambda: [int(t) for t in rng.integers(0, V, prompt_tokens)]  # noqa: E731
    # warm-up: the row counts the load reaches compile and capture before anything is timed
    warm = [submit(engine, prompt(), 8) for _ in range(min(streams, 8))]
    for w in warm:
        w.done.wait()
    # the interactive request alone, then the same request again under load
    ids = prompt()
    alone = submit(engine, ids, max_tokens, interactive=True)
    alone.done.wait()
    arrivals = np.cumsum(rng.exponential(1.0 / rate, streams))
    background: list[Timed] = []
    t_start = time.perf_counter()
    loaded = None
    for i, at in enumerate(arrivals):
        time.sleep(max(0.0, t_start + at - time.perf_counter()))
        background.append(submit(engine, prompt(), max_tokens))
        if i == streams // 2:  # the user types while half the load has arrived
            loaded = submit(engine, ids, max_tokens, interactive=True)
    for t in (*background, loaded):
        t.done.wait()
    wall = time.perf_counter() - t_start
    failed = [t.final for t in (*background, loaded, alone) if not isinstance(t.final, DoneEvent)]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0]}")
    ttft = [t.ttft for t in background]
    decode = [(t.n_tokens - 1) / (t.tokens[-1] - t.tokens[0]) for t in background if len(t.tokens) > 1]
    return dict(
        streams=streams, prompt_tokens=prompt_tokens, max_tokens=max_tokens, rate_per_s=rate,
        wall_s=wall, aggregate_tok_s=sum(t.n_tokens for t in (*background, loaded)) / wall,
        ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), ttft_max_s=max(ttft),
        decode_tok_s_p50=_pct(decode, 50),
        interactive_alone=dict(ttft_s=alone.ttft, itl_p50_ms=1e3 * _pct(alone.gaps, 50), itl_p99_ms=1e3 * _pct(alone.gaps, 99)),
        interactive_loaded=dict(ttft_s=loaded.ttft, itl_p50_ms=1e3 * _pct(loaded.gaps, 50), itl_p99_ms=1e3 * _pct(loaded.gaps, 99)),
        itl_p99_ratio=_pct(loaded.gaps, 99) / _pct(alone.gaps, 99),
        same_tokens=alone.final.text == loaded.final.text,
    )


def main(argv: list[str] | None = None) -> int:
    from bw24chat.engine import engine_for, open_engine
    from bw24chat.options import EngineOptions

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-m", "--model")
    src.add_argument("--synthetic", help="a random-weight shape (synthetic.SHAPES)")
    p.add_argument("--weights", default="q8_0", help="--synthetic's weight format")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rate", type=float, default=8.0, help="background arrivals a second (Poisson)")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--max-batch", type=int, default=0, help="the engine's --max-batch (0: its default)")
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--json", default=None, help="write the report here too")
    a = p.parse_args(argv)
    opts = EngineOptions(model=a.model, device=a.device, n_ctx=a.ctx, max_batch=a.max_batch, max_queue=max(64, 2 * a.streams))
    if a.synthetic:
        from bw24chat.synthetic import synthetic_checkpoint

        ck = synthetic_checkpoint(a.synthetic, a.weights.upper())
        engine = engine_for(ck, opts, aliases=(ck.name,))
    else:
        engine = open_engine(opts)
    try:
        r = dict(model=engine.info.name, device=engine.info.device_name,
                 **run(engine, a.streams, a.prompt_tokens, a.max_tokens, a.rate, a.seed))
    finally:
        engine.close()
    print(json.dumps(r, indent=1))
    il, ia = r["interactive_loaded"], r["interactive_alone"]
    print(f"{r['model']} on {r['device']}: {r['streams']} requests of {r['prompt_tokens']} + {r['max_tokens']} tokens at "
          f"{r['rate_per_s']:g}/s: {r['aggregate_tok_s']:.1f} tok/s aggregate; TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms, "
          f"p99 {r['ttft_p99_s'] * 1e3:.0f} ms; interactive inter-token p50 / p99 {il['itl_p50_ms']:.2f} / "
          f"{il['itl_p99_ms']:.2f} ms under load, {ia['itl_p50_ms']:.2f} / {ia['itl_p99_ms']:.2f} alone "
          f"(p99 x{r['itl_p99_ratio']:.2f}); same tokens: {r['same_tokens']}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
