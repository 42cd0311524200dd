"""The SIMT decode matvec (matvec.cu) of m rows on SmolLM2-135M's matrices, per geometry, on this GPU
(device): how MATVEC_ROWS_TUNING's entries for small float-contract matrices were chosen.

    python3 tools/matvec_rows_sweep.py [--rows 1,2,4,8]

SmolLM2-135M-Instruct Q4_1's decode matrices on synthetic weights (bw24chat.synthetic): qkv 960 x
576 (rmsnorm), o 576 x 576 (add), gate|up 3072 x 576 (rmsnorm, swiglu), down 576 x 1536 (add) on
the float contract, and the tied Q8_0 LM head 49152 x 576 (rmsnorm) on the integer dot, which
matvec_mma does not take (inputs not a multiple of 256).  Each line: one matrix at m rows, us per
launch for the geometry MATVEC_ROWS_TUNING picks ("picked"), the kernel's defaults (no entry) and
each alternative (its defines over the picked ones; R rows per warp, U load slots per lane, NW warps per block, MINB blocks per SM;
under swiglu the rows per warp stay even).  A layer's matrix is one of 30 distinct copies in one
CUDA graph (SmolLM2's 30 layers: the graph reads what a decode step reads); the median of 7 timings
of 10 replays (decode_floor.time_graph).  Every geometry gives the same bits (matvec.cu: exactness;
tests/gpu/test_matvec.py).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from decode_floor import time_graph  # tools/ (this script's folder) is on sys.path

SHAPES = [("qkv", 960, 576, "rmsnorm"), ("o", 576, 576, "add"), ("gate|up", 3072, 576, "swiglu"),
          ("down", 576, 1536, "add"), ("lm_head", 49152, 576, "rmsnorm")]
ALTERNATIVES = ["defaults", {"MV_R": 1}, {"MV_U": 1}, {"MV_U": 4}, {"MV_NW": 16, "MV_STAT8": 1},
                {"MV_R": 1, "MV_NW": 16, "MV_STAT8": 1}, {"MV_MINB": 2}, {"MV_R": 1, "MV_U": 1}, {"MV_R": 1, "MV_U": 4}]
LAYERS = 30


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8", help="comma list of m (1..8)")
    args = p.parse_args(argv)
    import cupy as cp

    from bw24chat.backends import cuda_linear as cl, cuda_weights as cw
    from bw24chat.synthetic import random_matrix

    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    print(f"{cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}; us per launch "
          f"(median of 7 x 10 graph replays)", flush=True)
    for name, n_out, n_in, kind in SHAPES:
        fmt = "Q8_0" if name == "lm_head" else "Q4_1"
        a8, swiglu = fmt == "Q8_0", kind == "swiglu"
        copies = 1 if name == "lm_head" else LAYERS
        Ws = [cw.upload([random_matrix(fmt, n_out, n_in, rng)]) for _ in range(copies)]
        for m in [int(r) for r in args.rows.split(",")]:
            x = cp.asarray(rng.standard_normal((m, n_in)).astype(np.float32))
            norm_w = cp.asarray(rng.uniform(0.5, 1.5, n_in).astype(np.float32))
            out = cp.zeros((m, n_out // 2 if swiglu else n_out), cp.float32)
            if kind == "add":
                launch = lambda c: cl.matvec(Ws[c], x, out, m, epilogue="add", impl="simt")  # noqa: E731
            else:
                launch = lambda c: cl.matvec(Ws[c], x, out, m, "rmsnorm", kind if swiglu else "store",  # noqa: E731
                                             norm_w=norm_w, impl="simt")
            key = cl.rows_tuning_key(fmt, a8, swiglu)
            picked = cl.MATVEC_ROWS_TUNING.get(key)
            cells = []
            for alt in [None] + (ALTERNATIVES if m > 1 else []):
                if isinstance(alt, dict) and swiglu and alt.get("MV_R", 2) % 2:
                    continue
                if alt == "defaults":  # the kernel's own (no entry)
                    cl.MATVEC_ROWS_TUNING.pop(key, None)
                elif alt is not None:
                    cl.MATVEC_ROWS_TUNING[key] = {**(picked or {}), **alt}
                try:
                    us = time_graph(cp, stream, launch, copies)
                finally:
                    if picked is None:
                        cl.MATVEC_ROWS_TUNING.pop(key, None)
                    else:
                        cl.MATVEC_ROWS_TUNING[key] = picked
                label = "picked" if alt is None else alt if isinstance(alt, str) else " ".join(f"{k[3:]}={v}" for k, v in alt.items())
                cells.append(f"{label}: {us:6.2f}")
            print(f"{fmt:5s} {name:8s} {n_out:5d} x {n_in:4d} m={m}  " + " | ".join(cells), flush=True)
        Ws = None
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
