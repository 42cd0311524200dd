"""Device micro-benchmark of the attention / norm / rope / sampling kernels (run on a GPU machine):

    python bench/kernels_ops.py [--kv bf16,q8_0,fp8] [--quick]

Qwen3-8B attention shape (32 query heads, 8 kv heads, head dim 128) unless noted.
Decode attention at contexts 512 / 8192 / 32768 (m = 1, and m = 8 at 8192): GB/s on the KV
bytes read (codes + scales of the attended positions), % of ~4.2 TB/s; enough cache copies are
rotated (> 150 MB) that L2 cannot serve them.  Prefill attention: TFLOP/s (4*H*hd per causal
query-key pair) at T = 512 / 2048 from position 0.  RMSNorm / add+RMSNorm (D = 4096), the fused
qk-norm+rope+kv-write (T = 1 and 2048), argmax and the sampler (V = 151936).
CUDA events, 2 warm-up rounds, median of 7; a compact table is printed last.

Caveat (measured 2026-12-02): these are single launches from Python between CUDA events, so a
kernel shorter than the ~6 us CuPy launch path is timed as the launch (attention at 512 keys read
42 us here and 13 us inside a graph).  For in-situ figures use `bw24chat bench --profile` and
`bench/matvec_variants.py`, which time inside CUDA graphs.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels_linear import time_it  # noqa: E402  (CUDA events, warm-up, median; one timer for all benches)

PEAK_BW = 4.2e12
PEAK_FLOPS = 790e12
H, K, HD = 32, 8, 128


def main():
    import cupy as cp

    from bw24chat.api import SamplingParams
    from bw24chat.backends import cuda_ops as ops
    from bw24chat.backends import kernel_refs as kr
    from bw24chat.rope import build_rope_table

    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", default="bf16,q8_0,fp8")
    ap.add_argument("--quick", action="store_true", help="bf16 only, no 32k context")
    args = ap.parse_args()
    kv_types = ["bf16"] if args.quick else args.kv.split(",")
    rows = []  # (op, shape, time_us, metric)
    t0 = time.time()
    scale = 1.0 / math.sqrt(HD)

    # ---------------------------------------------------------------- decode attention
    for kv in kv_types:
        for ctx in (512, 8192) + (() if args.quick else (32768,)):
            row_bytes = kr.kv_cache_nbytes(kv, 1, K, HD)  # K or V, one position, all kv heads
            n_rot = max(2, math.ceil(150e6 / (2 * row_bytes * (ctx + 8))))
            caches = []
            for _ in range(n_rot):
                ck, cv = ops.kv_cache_alloc(kv, ctx + 8, K, HD), ops.kv_cache_alloc(kv, ctx + 8, K, HD)
                for c in (ck, cv):
                    if kv == "bf16":
                        c[...] = cp.random.randint(0, 1 << 16, c.shape, dtype=cp.int32).astype(cp.uint16) & 0xBFFF
                    else:  # valid codes, scales small
                        c.view(cp.uint8)[...] = cp.random.randint(0, 0x7E, c.shape, dtype=cp.int32).astype(cp.uint8)
                        n_codes = (ctx + 8) * K * HD
                        sc = c.reshape(-1)[n_codes:]
                        if kv == "q8_0":
                            sc.view(cp.float16)[...] = cp.float16(0.01)
                        else:
                            sc.view(cp.float32)[...] = cp.float32(0.01)
                caches.append((ck, cv))
            ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, HD), cp.uint8)
            for m in (1, 8) if ctx == 8192 else (1,):
                q = cp.random.standard_normal((m, H, HD), dtype=cp.float32)
                out = cp.empty((m, H, HD), cp.float32)
                lengths = cp.arange(ctx - m + 1, ctx + 1, dtype=cp.int32)
                fn = lambda i: ops.attn_decode(q, caches[i][0], caches[i][1], kv, lengths, m, scale, out, ws)  # noqa: E731
                t = time_it(cp, fn, n_rot)
                gbs = 2 * row_bytes * ctx / t / 1e9
                rows.append(("attn_decode", f"{kv} ctx={ctx} m={m}", t * 1e6, f"{gbs:7.0f} GB/s {gbs * 1e9 / PEAK_BW:5.1%}"))
            del caches

    # ---------------------------------------------------------------- prefill attention
    for kv in kv_types:
        for T in (512, 2048):
            ck, cv = ops.kv_cache_alloc(kv, T, K, HD), ops.kv_cache_alloc(kv, T, K, HD)
            for c in (ck, cv):
                c.view(cp.uint8)[...] = cp.random.randint(0, 0x3F, c.view(cp.uint8).shape, dtype=cp.int32).astype(cp.uint8)
            q = cp.random.standard_normal((T, H, HD), dtype=cp.float32)
            out = cp.empty((T, H, HD), cp.float32)
            t = time_it(cp, lambda i: ops.attn_prefill(q, ck, cv, kv, 0, T, scale, out), 1)  # noqa: B023
            flops = 4.0 * H * HD * T * (T + 1) / 2
            rows.append(("attn_prefill", f"{kv} T={T}", t * 1e6, f"{flops / t / 1e12:7.1f} TFLOP/s {flops / t / PEAK_FLOPS:5.1%}"))

    # ---------------------------------------------------------------- norm / rope
    D = 4096
    w = cp.random.standard_normal(D, dtype=cp.float32)
    for T in (1, 2048):
        x = cp.random.standard_normal((T, D), dtype=cp.float32)
        r = cp.random.standard_normal((T, D), dtype=cp.float32)
        out = cp.empty_like(x)
        t = time_it(cp, lambda i: ops.rmsnorm(x, w, 1e-6, out), 1)  # noqa: B023
        rows.append(("rmsnorm", f"T={T} D={D}", t * 1e6, f"{2 * x.nbytes / t / 1e9:7.0f} GB/s"))
        t = time_it(cp, lambda i: ops.add_rmsnorm(x, r, w, 1e-6, out), 1)  # noqa: B023
        rows.append(("add_rmsnorm", f"T={T} D={D}", t * 1e6, f"{4 * x.nbytes / t / 1e9:7.0f} GB/s"))
    tab = build_rope_table(HD, 1.0, 1e6, None, 4096, "neox", 4096)
    cos, sin = cp.asarray(tab.cos), cp.asarray(tab.sin)
    ck, cv = ops.kv_cache_alloc("bf16", 4096, K, HD), ops.kv_cache_alloc("bf16", 4096, K, HD)
    nw = cp.ones(HD, cp.float32)
    for T in (1, 2048):
        q = cp.random.standard_normal((T, H, HD), dtype=cp.float32)
        k = cp.random.standard_normal((T, K, HD), dtype=cp.float32)
        v = cp.random.standard_normal((T, K, HD), dtype=cp.float32)
        pos = cp.arange(T, dtype=cp.int32)
        fn = lambda i: ops.qk_norm_rope_kv_write(q, k, v, nw, nw, 1e-6, cos, sin, pos, "neox", HD, ck, cv, "bf16")  # noqa: B023, E731
        t = time_it(cp, fn, 1)
        nbytes = 2 * q.nbytes + 3 * k.nbytes + k.nbytes + 2 * k.size * 2
        rows.append(("qk_norm_rope_kv_write", f"T={T} bf16", t * 1e6, f"{nbytes / t / 1e9:7.0f} GB/s"))

    # ---------------------------------------------------------------- sampling
    V = 151936
    logits = cp.random.standard_normal(V, dtype=cp.float32) * 3
    tok = cp.zeros(1, cp.int32)
    t = time_it(cp, lambda i: ops.argmax(logits, tok), 1)
    rows.append(("argmax", f"V={V}", t * 1e6, ""))
    ws = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
    ring = cp.zeros(64, cp.int32)
    pos = cp.zeros(1, cp.int32)
    for label, p in [("top_k=40", SamplingParams(temperature=0.7, top_k=40, top_p=0.95)),
                     ("top_p=0.9", SamplingParams(temperature=1.0, top_p=0.9)),
                     ("min_p+pen", SamplingParams(temperature=0.8, min_p=0.05, repeat_penalty=1.1))]:
        params = cp.asarray(ops.pack_sampling_params(p, 1234, hist_len=64))
        t = time_it(cp, lambda i: ops.sample(logits, params, tok, ring, pos, ws), 1)  # noqa: B023
        rows.append(("sample", f"V={V} {label}", t * 1e6, ""))

    print(f"\n(total {time.time() - t0:.0f} s)")
    print(f"{'op':<24}{'shape':<28}{'time us':>10}  metric")
    for op, shape, us, metric in rows:
        print(f"{op:<24}{shape:<28}{us:>10.1f}  {metric}")


if __name__ == "__main__":
    main()
