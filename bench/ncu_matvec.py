"""One eager launch of each decode matvec on the Qwen3-8B shapes, for Nsight Compute (device):

    ncu --clock-control none --kernel-name regex:matvec --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats python3 bench/ncu_matvec.py [--formats nvfp4,bf16]

Each (format, shape) is launched once with the engine's default kernel choice and geometry (the
rmsnorm prologue where the decode step has one), so the profile shows what the decode step runs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SHAPES = {"qkv": (6144, 4096, "rmsnorm"), "o": (4096, 4096, "none"), "gate|up": (24576, 4096, "rmsnorm"),
          "down": (4096, 12288, "none"), "lm_head": (49152, 4096, "rmsnorm")}  # Qwen3-8B: rows, inputs, prologue


def main() -> int:
    import cupy as cp

    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import repack_host, upload
    from bw24chat.synthetic import random_matrix

    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="nvfp4,bf16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for fmt in [f.upper() for f in args.formats.split(",")]:
        for name in args.shapes.split(","):
            out, in_, pro = SHAPES[name]
            t = random_matrix(fmt, out, in_, rng)
            W = upload([t], repack_host([t]))
            x = cp.asarray(rng.standard_normal((1, in_)).astype(np.float32))
            nw = cp.asarray(rng.uniform(0.5, 1.5, in_).astype(np.float32))
            y = cp.empty((1, out), cp.float32)
            lin.matvec(W, x, y, 1, prologue=pro, norm_w=nw)
            cp.cuda.runtime.deviceSynchronize()
            print(f"launched {fmt} {name}", flush=True)
            del W
    return 0


if __name__ == "__main__":
    sys.exit(main())
