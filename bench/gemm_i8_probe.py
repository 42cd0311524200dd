"""gemm_i8 at real shapes, one subprocess per case (an illegal address poisons the context):
python3 bench/gemm_i8_probe.py [rows in T [eager]] ..."""
import os
import subprocess
import sys

import numpy as np

CASES = [(200, 1024, 300), (1000, 4096, 512), (6144, 4096, 512), (300, 12288, 512), (4096, 12288, 512),
         (24576, 4096, 512), (1000, 4096, 2048)]


def one(rows, n, T, eager):
    os.environ["BW24CHAT_GEMM_I8"] = "1"
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import cupy as cp
    from test_repack import random_qtensor
    from bw24chat.backends import cuda_weights as cw, cuda_linear as cl
    from bw24chat.backends.kernel_build import eager_launches
    from bw24chat.backends.kernel_refs import act_quant_ref

    rng = np.random.default_rng(1)
    t = random_qtensor(rng, "Q8_0", rows, n)
    W = cw.upload([t])
    x = rng.standard_normal((T, n)).astype(np.float32)
    out = cp.full((T, rows), cp.nan, cp.float32)
    s = cp.cuda.Stream(non_blocking=True) if os.environ.get("PROBE_STREAM", "1") == "1" else cp.cuda.Stream.null
    with s:
        if eager:
            with eager_launches():
                cl.gemm(W, cp.asarray(x), out, T)
        else:
            cl.gemm(W, cp.asarray(x), out, T)
    s.synchronize()
    got = cp.asnumpy(out)
    cols = rng.choice(rows, min(rows, 64), replace=False)
    w = t.dequantize()[cols].astype(np.float64)
    xq = act_quant_ref(x).astype(np.float64)
    ref = xq @ w.T
    bound = np.abs(xq) @ np.abs(w).T
    err = np.max(np.abs(got[:, cols] - ref) / (bound + 1e-30))
    print(f"rows={rows} n={n} T={T} eager={eager}: nan={int(np.isnan(got).sum())} max rel err {err:.2e}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(*map(int, sys.argv[2:5]), eager=sys.argv[5] == "1")
        sys.exit(0)
    for rows, n, T in CASES:
        for eager in (0, 1):
            r = subprocess.run([sys.executable, __file__, "--one", str(rows), str(n), str(T), str(eager)],
                               capture_output=True, text=True, timeout=120)
            lines = (r.stdout + r.stderr).strip().splitlines()
            print(lines[-1] if r.returncode == 0 else f"rows={rows} n={n} T={T} eager={eager}: FAILED rc={r.returncode} " + " | ".join(l for l in lines if "Error" in l)[:300])
