"""Device micro-benchmark of the linear kernels on Qwen3-8B shapes (run on a GPU machine):

    python bench/kernels_linear.py [--formats bf16,q8_0,q4_k,nvfp4] [--quick]

matvec at m=1 (and m=8 for one shape): median of >= 5 CUDA-event timings after warm-up,
rotating among enough weight copies (> 2x the 60 MB L2) that L2 cannot serve them; GB/s on
weight bytes (all planes) and % of 4.2 TB/s.  gemm: TFLOP/s at T = 512 and 2048 vs ~790.
Random weights (valid blocks); a compact table is printed last.  Runs in well under 2 minutes.

Caveat (measured 2026-12-02): these are single launches from Python between CUDA events, so a
kernel shorter than the ~6 us CuPy launch path is timed as the launch (attention at 512 keys read
42 us here and 13 us inside a graph).  For in-situ figures use `bw24chat bench --profile` and
`bench/matvec_variants.py`, which time inside CUDA graphs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BW = 4.2e12
PEAK_FLOPS = 790e12
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate|up", 24576, 4096), ("down", 4096, 12288), ("lm_head", 151936, 4096)]
FMT_NAMES = {"bf16": "BF16", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K", "nvfp4": "NVFP4"}


def random_raw(rng, fmt, out, in_):
    from bw24chat.loaders.tensor import QTensor
    from tests.test_repack import random_qtensor

    if fmt == "BF16":  # random bits with |v| < 2 (fast for the 1.2 GB lm_head)
        return QTensor("w", fmt, (out, in_), rng.integers(0, 1 << 16, (out, in_), dtype=np.uint16) & np.uint16(0xBFFF))
    return random_qtensor(rng, fmt, out, in_)


def time_it(cp, fn, n_rot, reps=7, warm=2):
    for i in range(warm * n_rot):
        fn(i % n_rot)
    ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    ts = []
    for r in range(reps):
        a, b = ev[r]
        a.record()
        for i in range(n_rot):
            fn(i)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3 / n_rot)
    return float(np.median(ts))


def main():
    import cupy as cp

    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends import cuda_weights as cw

    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,q8_0,q4_k,nvfp4")
    ap.add_argument("--quick", action="store_true", help="skip lm_head and the T=2048 gemm")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    t_start = time.time()
    for name in args.formats.split(","):
        fmt = FMT_NAMES[name]
        for sname, out, in_ in SHAPES:
            if args.quick and sname == "lm_head":
                continue
            # build one copy on the host, replicate on the device (distinct buffers)
            base = cw.upload([random_raw(rng, fmt, out, in_)])
            n_rot = max(2, int(np.ceil(150e6 / base.nbytes)))
            copies = [base]
            for _ in range(n_rot - 1):
                c = cw.DeviceWeight(**{**base.__dict__})
                for k in ("q", "h", "s", "d"):
                    if getattr(base, k) is not None:
                        setattr(c, k, getattr(base, k).copy())
                copies.append(c)
            for m in ((1, 8) if sname == "o" else (1,)):
                x = cp.asarray(rng.standard_normal((m, in_)).astype(np.float32))
                o = cp.zeros((m, out), cp.float32)
                t = time_it(cp, lambda i: cl.matvec(copies[i], x, o, m), n_rot)
                bw = base.nbytes / t
                rows.append((fmt, f"matvec m={m}", sname, t * 1e6, f"{bw / 1e9:7.0f} GB/s", f"{100 * bw / PEAK_BW:5.1f}%"))
                print(*rows[-1], flush=True)
            if sname in ("qkv", "gate|up"):
                for T in ((512,) if args.quick else (512, 2048)):
                    x = cp.asarray(rng.standard_normal((T, in_)).astype(np.float32))
                    o = cp.zeros((T, out), cp.float32)
                    t = time_it(cp, lambda i: cl.gemm(copies[i % len(copies)], x, o, T), min(n_rot, 3), reps=5)
                    fl = 2.0 * T * out * in_ / t
                    rows.append((fmt, f"gemm T={T}", sname, t * 1e6, f"{fl / 1e12:7.1f} TF/s", f"{100 * fl / PEAK_FLOPS:5.1f}%"))
                    print(*rows[-1], flush=True)
            del copies, base
            cp.get_default_memory_pool().free_all_blocks()
    print(f"\n# bw24chat linear kernels ({time.time() - t_start:.0f} s); % of {PEAK_BW / 1e12:.1f} TB/s or {PEAK_FLOPS / 1e12:.0f} TFLOP/s")
    print(f"{'format':7} {'kernel':13} {'shape':8} {'us':>9} {'rate':>14} {'%':>6}")
    for r in rows:
        print(f"{r[0]:7} {r[1]:13} {r[2]:8} {r[3]:9.1f} {r[4]:>14} {r[5]:>6}")


if __name__ == "__main__":
    main()
