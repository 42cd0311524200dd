"""Locate the rows where split-KV prefill attention (f32/fp8/q8_0 caches) goes wrong at the
SmolLM2 shape (H=9, K=3, hd=64, n_ctx=2048): per chunking, the worst (token, head) errors."""
import math

import numpy as np


def main():
    import cupy as cp

    from bw24chat.backends import cuda_ops as ops
    from bw24chat.backends import kernel_refs as kr

    rng = np.random.default_rng(0)
    H, K, hd, N, T = 9, 3, 64, 2048, 512
    for kv in ("f32", "fp8", "bf16"):
        ks = rng.standard_normal((N, K, hd)).astype(np.float32)
        vs = rng.standard_normal((N, K, hd)).astype(np.float32)
        bk = kr.kv_cache_pack(*kr.kv_quantize(ks, kv), kv)
        bv = kr.kv_cache_pack(*kr.kv_quantize(vs, kv), kv)
        kvv, vvv = kr.kv_cache_values(bk, kv, N, K, hd), kr.kv_cache_values(bv, kv, N, K, hd)
        q = rng.standard_normal((T, H, hd)).astype(np.float32)
        ref = kr.attention_ref(q, kvv, vvv, np.arange(T), 1 / math.sqrt(hd))
        for chunk in (512, 256):
            out = cp.full((T, H, hd), np.nan, cp.float32)
            qd = cp.asarray(q)
            for s in range(0, T, chunk):
                ops.attn_prefill(qd[s:s + chunk], cp.asarray(bk), cp.asarray(bv), kv, s, min(chunk, T - s), 1 / math.sqrt(hd), out[s:s + chunk])
            got = cp.asnumpy(out)
            err = np.abs(got - ref).max(axis=2) / np.abs(ref).max()
            bad = np.argwhere(err > 1e-3)
            print(f"kv={kv} chunk={chunk}: max err {err.max():.2e}, bad (token, head) {len(bad)}: {bad[:8].tolist()} nan={np.isnan(got).sum()}")


if __name__ == "__main__":
    main()
