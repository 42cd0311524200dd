"""Decode attention cost on the Qwen3-8B shape (H=32, K=8, hd=128), measured inside CUDA graphs
(device):  python3 bench/attn_probe.py [--kv bf16,q8_0] [--lengths 1,512,2048,8192] [--heads 32,8] [--rows 1,4,8]

Per (cache type, L): 36 attn_decode launches over 36 different caches (as one decode step, so
the L2 holds no more than it would there) captured in one graph; us per launch, median of 7 x 10
replays.  Also the fused rope / k-norm / cache-write kernel at T=1, and a plain read of the same
K/V bytes (the streaming floor).  Variants through the experiment knobs of cuda_ops:
BW24CHAT_ATTN_SPLITS (max splits per (row, kv head)), BW24CHAT_ATTN_MIN_PER (tiles per split),
BW24CHAT_ATTN_CLUSTER (the split merge: 0 workspace, 8 / 16 thread-block cluster).  --heads H,K
takes other shapes (Qwen3-30B-A3B: 32,4; GLM-4.5: 96,8).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_floor import time_graph  # noqa: E402

HD, LAYERS = 128, 36


def main() -> int:
    import cupy as cp

    from bw24chat.backends import cuda_ops as ops
    from bw24chat.rope import build_rope_table

    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", default="bf16")
    ap.add_argument("--lengths", default="1,512,2048,8192")
    ap.add_argument("--heads", default="32,8", help="query heads, kv heads")
    ap.add_argument("--rows", default="1", help="decode rows per launch (speculative verify: K + 1), comma list")
    ap.add_argument("--ncu", action="store_true", help="one eager launch per (cache, L, variant): for Nsight Compute")
    ap.add_argument("--variants", default="default;BW24CHAT_ATTN_SPLITS=8;BW24CHAT_ATTN_SPLITS=16;"
                    "BW24CHAT_ATTN_SPLITS=64;BW24CHAT_ATTN_MIN_PER=4")
    a = ap.parse_args()
    H, K = (int(v) for v in a.heads.split(","))
    stream = cp.cuda.Stream(non_blocking=True)
    lengths = [int(v) for v in a.lengths.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    for kv in a.kv.split(","):
        n_ctx = max(lengths) + 8
        caches = []
        for _ in range(LAYERS):
            ck = ops.kv_cache_alloc(kv, n_ctx, K, HD)
            cv = ops.kv_cache_alloc(kv, n_ctx, K, HD)
            # random bits are fine for bf16 / f32 timing only when finite: fill from normals
            if kv in ("bf16", "f32"):
                vals = cp.random.standard_normal(ck.size, dtype=cp.float32)
                if kv == "bf16":
                    ck[...] = (vals.view(cp.uint32) >> 16).astype(cp.uint16).reshape(ck.shape)
                    cv[...] = ck
                else:
                    ck[...] = vals.reshape(ck.shape)
                    cv[...] = ck
            caches.append((ck, cv))
        max_m = max(int(v) for v in a.rows.split(","))  # rows' lengths L..L+m-1 stay inside n_ctx (m <= 8)
        q = cp.asarray(rng.standard_normal((max_m, H, HD)).astype(np.float32))
        out = cp.empty((max_m, H, HD), cp.float32)
        for L, m in [(L, int(m)) for L in lengths for m in a.rows.split(",")]:
            lens = cp.asarray(np.arange(L, L + m, dtype=np.int32))
            kv_bytes = 2 * (L + m - 1) * K * HD * {"bf16": 2, "f32": 4, "q8_0": 1, "fp8": 1}[kv]  # each key read once (L2 serves the rows)
            for var in a.variants.split(";"):
                env = dict(v.split("=") for v in var.split(",") if "=" in v)
                old = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                try:
                    ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, HD), cp.uint8)
                    if a.ncu:
                        ops.attn_decode(q, caches[0][0], caches[0][1], kv, lens, m, 1 / math.sqrt(HD), out, ws)
                        cp.cuda.runtime.deviceSynchronize()
                        print(f"launched {kv} L={L} m={m} {var}", flush=True)
                        continue
                    us = time_graph(cp, stream, lambda c: ops.attn_decode(
                        q, caches[c][0], caches[c][1], kv, lens, m, 1 / math.sqrt(HD), out, ws), LAYERS)
                finally:
                    for k, v in old.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                if a.ncu:
                    continue
                rows.append((kv, L, m, var, us, kv_bytes / us / 1e3))
                print(f"{kv:5s} L={L:5d} m={m} {var:28s} {us:7.2f} us  {kv_bytes / us / 1e3:6.0f} GB/s", flush=True)
        if a.ncu:
            continue
        # the rope / norm / cache-write prologue of one decode step (T = 1)
        rt = build_rope_table(HD, 1.0, 1e6, None, n_ctx, "neox", n_ctx)
        cos, sin = cp.asarray(rt.cos), cp.asarray(rt.sin)
        qkv = cp.asarray(rng.standard_normal((1, (H + 2 * K) * HD)).astype(np.float32))
        qn = cp.asarray(rng.uniform(0.5, 1.5, HD).astype(np.float32))
        pos = cp.asarray(np.array([100], np.int32))
        qv = qkv[:, :H * HD].reshape(1, H, HD)
        kk = qkv[:, H * HD:(H + K) * HD].reshape(1, K, HD)
        vv = qkv[:, (H + K) * HD:].reshape(1, K, HD)
        us = time_graph(cp, stream, lambda c: ops.qk_norm_rope_kv_write(
            qv, kk, vv, qn, qn, 1e-6, cos, sin, pos, "neox", HD, caches[c][0], caches[c][1], kv), LAYERS)
        print(f"{kv:5s} qk_norm_rope_kv_write T=1 {us:7.2f} us", flush=True)
        del caches
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
