"""Prefill GEMM variants on the Qwen3-8B projection shapes at T tokens (device):

    python3 bench/gemm_variants.py [--formats bf16,q8_0,q4_k,nvfp4] [--T 512] [--check]

For each shape (qkv 6144x4096, o 4096x4096, gate|up 24576x4096, down 4096x12288) and weight
format, the portable mma.sync kernel (`gemm`) and the Hopper wgmma kernel (`gemm_wg`, 128 and
256 rows per block) are timed in the precise (split bf16) and fast (plain bf16) modes: COPIES
weight copies launched back to back in one CUDA graph, median of 7 x 10 replays
(decode_floor.time_graph).  Prints us per launch and TFLOP/s (2 T out in per launch).  With
--check, every variant's output is compared with the portable precise kernel's (max relative
difference to sum |x||w|), so a variant that is fast because it is wrong shows it.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_floor import reset_switches, time_graph  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate|up": (24576, 4096), "down": (4096, 12288)}
# (label, impl, environment): "wg" is gemm_wgp (bf16 planes, cp.async ring; ring depth clamped
# to the shared memory) unless BW24CHAT_WGP=0 (gemm_wg, register-staged)
VARIANTS = [("mma", "mma", {}),
            ("wg n128", "wg", {"BW24CHAT_WG_BN": "128", "BW24CHAT_WGP": "0"}),
            ("wg n256", "wg", {"BW24CHAT_WG_BN": "256", "BW24CHAT_WGP": "0"}),
            ("wgp n128 s3", "wg", {"BW24CHAT_WG_BN": "128", "BW24CHAT_WGP_STAGES": "3"}),
            ("wgp n128 s4", "wg", {"BW24CHAT_WG_BN": "128", "BW24CHAT_WGP_STAGES": "4"}),
            ("wgp n256 s3", "wg", {"BW24CHAT_WG_BN": "256", "BW24CHAT_WGP_STAGES": "3"}),
            ("wgp n256 s4", "wg", {"BW24CHAT_WG_BN": "256", "BW24CHAT_WGP_STAGES": "4"}),
            ("wgp auto", "wg", {})]
COPIES = 3


def main() -> int:
    import cupy as cp

    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import repack_host, upload
    from bw24chat.synthetic import random_matrix

    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,q8_0,q4_k,nvfp4")
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--variants", default="")
    args = ap.parse_args()
    variants = [v for v in VARIANTS if not args.variants or v[0] in args.variants.split(",")]
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    T = args.T
    rows = []
    for fmt in [f.upper() for f in args.formats.split(",")]:
        for name, (out, in_) in SHAPES.items():
            t = random_matrix(fmt, out, in_, rng)
            hp = repack_host([t])
            Ws = [upload([t], hp) for _ in range(COPIES)]
            x = cp.asarray(rng.standard_normal((T, in_)).astype(np.float32))
            ys = [cp.empty((T, out), cp.float32) for _ in range(COPIES)]
            bound = None
            for precise in (True, False):
                ref = None
                for label, impl, env in variants:
                    reset_switches()
                    os.environ.update(env)
                    try:
                        us = time_graph(cp, stream, lambda c: lin.gemm(Ws[c], x, ys[c], T, precise=precise, impl=impl), COPIES)
                    except Exception as e:  # a variant that cannot launch (e.g. shared memory) is reported, not fatal
                        print(f"{fmt:6} {name:8} {label:12} FAILED {type(e).__name__}: {e}", flush=True)
                        continue
                    tf = 2.0 * T * out * in_ / (us * 1e-6) / 1e12
                    note = ""
                    if args.check:
                        got = cp.asnumpy(ys[0]).astype(np.float64)
                        if ref is None:
                            ref = got
                            if bound is None:
                                wabs = cp.abs(cp.asarray(lin_dequant(lin, Ws[0], cp)))
                                bound = cp.asnumpy(cp.abs(x) @ wabs.T).astype(np.float64) + 1e-30
                        note = f"  max rel diff vs first {np.max(np.abs(got - ref) / bound):.2e}"
                    mode = "precise" if precise else "fast"
                    rows.append((fmt, name, mode, label, us, tf))
                    print(f"{fmt:6} {name:8} {mode:7} {label:8} {us:9.1f} us {tf:7.1f} TFLOP/s{note}", flush=True)
            del Ws, ys
            cp.get_default_memory_pool().free_all_blocks()
    reset_switches()
    print("\nper-layer totals (us, sum of the four shapes):")
    for fmt in sorted({r[0] for r in rows}):
        for mode in ("precise", "fast"):
            tot = {}
            for r in rows:
                if r[0] == fmt and r[2] == mode:
                    tot[r[3]] = tot.get(r[3], 0.0) + r[4]
            print(f"  {fmt:6} {mode:7} " + "  ".join(f"{k} {v:8.1f}" for k, v in tot.items()))
    return 0


def lin_dequant(lin, W, cp):
    w = cp.empty((W.out, W.in_), cp.float32)
    lin.dequantize(W, w)
    return w


if __name__ == "__main__":
    sys.exit(main())
