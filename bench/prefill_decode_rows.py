"""Prefill GEMM rows against decode matvec rows of the same x, per GEMM path (device):

    python3 bench/prefill_decode_rows.py

Q8_0 on the Qwen3-8B shapes: gemm_i8 (the integer-dot contract, the decode's), the bf16 split
contract (gemm_wra, the pass + gemm_wgp, the portable mma.sync kernel: x_lo . W_lo dropped) and
the fast mode; prints max|gemm - matvec| / max|matvec|.  Nineteenth session (bench/NOTES.md):
4.7e-7 for gemm_i8, 1.6e-5 to 4.2e-5 for the split, ~8e-3 fast."""
import os
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cupy as cp
from bw24chat.backends import cuda_linear as lin
from bw24chat.backends.cuda_weights import upload
from bw24chat.synthetic import random_matrix

rng = np.random.default_rng(1)
for rows, cols in ((4096, 4096), (8192, 4096), (1024, 12288)):
    W = upload([random_matrix("Q8_0", rows, cols, rng)])
    T = 16
    x = cp.asarray(rng.standard_normal((T, cols)).astype(np.float32))
    dec = cp.empty((T, rows), cp.float32)
    for t in range(T):
        lin.matvec(W, x[t:t + 1], dec[t:t + 1], 1)
    dn = cp.asnumpy(dec).astype(np.float64)
    for label, env, impl, precise in (("wg", {}, "wg", True), ("wg i8=0", {"BW24CHAT_GEMM_I8": "0"}, "wg", True),
                                      ("wg wra=0", {"BW24CHAT_WRA": "0"}, "wg", True),
                                      ("wg i8=0 wra=0", {"BW24CHAT_GEMM_I8": "0", "BW24CHAT_WRA": "0"}, "wg", True),
                                      ("mma", {}, "mma", True), ("wg fast", {}, "wg", False)):
        for k in ("BW24CHAT_GEMM_I8", "BW24CHAT_WRA"):
            os.environ.pop(k, None)
        os.environ.update(env)
        out = cp.zeros((T, rows), cp.float32)
        lin.gemm(W, x, out, T, precise=precise, impl=impl)
        o = cp.asnumpy(out).astype(np.float64)
        rel = np.abs(o - dn).max() / np.abs(dn).max()
        print(f"Q8_0 {rows}x{cols} {label:14} max|gemm - matvec| / max|matvec| = {rel:.3e}", flush=True)
