"""The on-device sampler alone, timed inside CUDA graphs (device):

    python3 bench/sampler_probe.py [--vocab 49152,151936]

Why: on the H200 the sampled decode rows of `bw24chat bench` run 0.15-0.2 ms per token slower
than greedy (ninth session: NVFP4 tg128@512 372.5 tok/s at temperature 0.7 against 394.4
greedy), far more than a pass over 49k logits needs (~200 KB: well under 1 us of bandwidth).
This probe says which sampler settings cost what before the kernel (kernels/sampling.cu, one
block of 1024 threads doing radix-select passes) is reworked.

Per (vocabulary, setting): COPIES launches over different logit rows captured in one graph,
replayed 10 times between CUDA events, median of 7 (decode_floor.time_graph); us per launch.
The logits are random normals times 3 (a spread like a model's); the argmax kernel is the
greedy baseline.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_floor import time_graph  # noqa: E402

COPIES = 8
SETTINGS = {  # label -> SamplingParams fields (temperature 0: the argmax kernel)
    "greedy (argmax)": dict(temperature=0.0),
    "t0.7": dict(temperature=0.7),
    "t0.7 top-k 40": dict(temperature=0.7, top_k=40),
    "t0.7 top-k 40 top-p 0.9": dict(temperature=0.7, top_k=40, top_p=0.9),
    "t0.7 top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "t0.7 min-p 0.05": dict(temperature=0.7, min_p=0.05),
    "t0.7 penalty 1.1 / 64": dict(temperature=0.7, repeat_penalty=1.1, repeat_last_n=64),
}


def main() -> int:
    import cupy as cp

    from bw24chat.api import SamplingParams
    from bw24chat.backends import cuda_ops as ops

    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="49152,151936")
    a = ap.parse_args()
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    for V in (int(v) for v in a.vocab.split(",")):
        logits = [cp.asarray((rng.standard_normal(V) * 3).astype(np.float32)) for _ in range(COPIES)]
        ws = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
        tok = cp.zeros(1, cp.int32)
        pos = cp.asarray(np.array([100], np.int32))
        ring = cp.asarray(rng.integers(0, V, 64).astype(np.int32))
        for label, fields in SETTINGS.items():
            p = SamplingParams(**fields)
            if p.greedy:
                us = time_graph(cp, stream, lambda c: ops.argmax(logits[c], tok), COPIES)
            else:
                params = cp.asarray(ops.pack_sampling_params(p, seed=1234, hist_len=64))
                us = time_graph(cp, stream, lambda c: ops.sample(logits[c], params, tok, ring, pos, ws), COPIES)
            print(f"V={V:6d} {label:26s} {us:8.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
