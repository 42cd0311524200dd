"""One eager launch of each prefill GEMM on the Qwen3-8B shapes, for Nsight Compute (device):

    ncu --clock-control none --kernel-name regex:gemm --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
        python3 bench/ncu_gemm.py [--formats bf16,q8_0] [--T 512]

Each (format, shape) runs once through cuda_linear.gemm with the engine's default kernel choice
and geometry (precise mode: what `bench` pp512 measures), after one warm-up call that compiles.
The question it answers (bench/NOTES.md, twelfth session): is the precise prefill bound by the
L2 -> SM traffic of re-reading x once per column block (BF16 gemm_wgp ~4.8 TB/s counted, gemm_i8
~3.3 TB/s) rather than by the tensor pipes or, for gemm_i8, the per-block fold?
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate|up": (24576, 4096), "down": (4096, 12288)}


def main() -> int:
    import cupy as cp

    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import repack_host, upload
    from bw24chat.synthetic import random_matrix

    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,q8_0")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--T", type=int, default=512)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for fmt in [f.upper() for f in args.formats.split(",")]:
        for name in args.shapes.split(","):
            out, in_ = SHAPES[name]
            t = random_matrix(fmt, out, in_, rng)
            W = upload([t], repack_host([t]))
            x = cp.asarray(rng.standard_normal((args.T, in_)).astype(np.float32))
            y = cp.empty((args.T, out), cp.float32)
            lin.gemm(W, x, y, args.T)  # warm-up (compiles); ncu profiles both, the second is the figure
            lin.gemm(W, x, y, args.T)
            cp.cuda.runtime.deviceSynchronize()
            print(f"launched {fmt} {name} T={args.T}", flush=True)
            del W
    return 0


if __name__ == "__main__":
    sys.exit(main())
