"""The MoE decode expert kernels (moe_gu, moe_down) of one Qwen3-30B-A3B layer on this GPU, per
geometry (device):

    python3 tools/moe_geometry.py [--formats bf16,q8_0,nvfp4] [--rows 1,4]

The layer's 128 experts in each format (D 2048, F 768, top-8), COPIES launches of each kernel with
their own random expert choices captured in one CUDA graph (so the L2 seldom holds a launch's
experts, as in a decode step whose 48 layers read different experts), median of 7 timings of 10
replays.  Candidates: tuning.MOE_TUNING's pick (marked *) and other warps per block (MOE_NW),
load windows (MOE_U) and outputs per down unit (MOE_R); the outputs are the same bits for every
one (tests/gpu/test_moe.py).  Prints us per launch and GB/s of the expert bytes each launch reads;
the roofline is the copy rate (bench).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from decode_floor import time_graph  # tools/ (this script's folder) is on sys.path

E, F, D, K = 128, 768, 2048, 8
COPIES = 16


def candidates(kern: str, fmt: str) -> list[dict]:
    from bw24chat.backends import cuda_moe

    pick = cuda_moe.geometry(kern, fmt)
    out = [pick]
    for nw in (8, 16):
        for u in (2, 4, 6, 8, 12):
            for r in ((2,) if kern == "gu" else (1, 2, 4)):
                g = {"MOE_NW": nw, "MOE_U": u, "MOE_MINB": 1 if nw == 16 or r == 4 else 2}
                if kern == "down" and r != cuda_moe.MOE_R:
                    g["MOE_R"] = r
                if g != pick:
                    out.append(g)
    return out


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    from bw24chat.backends import cuda_moe
    from bw24chat.loaders.tensor import ExpertTensor
    from bw24chat.synthetic import random_experts

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="bf16,q8_0,nvfp4")
    p.add_argument("--rows", default="1", help="comma list of decode rows m")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    for fmt in a.formats.upper().split(","):
        g, u, d = (ExpertTensor(n, random_experts(fmt, E, r, c, rng)) for n, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
        ex = cuda_moe.load_experts(g, u, d)
        per_expert = {"gu": ex.gu.expert_nbytes, "down": ex.down.expert_nbytes}
        for m in (int(v) for v in a.rows.split(",")):
            ids = [cp.asarray(np.stack([rng.permutation(E)[:K] for _ in range(m)]).astype(np.int32)) for _ in range(COPIES)]
            w = cp.asarray(rng.random((m, K)).astype(np.float32))
            x = cp.asarray(rng.standard_normal((m, D)).astype(np.float32))
            nw = cp.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
            act = cp.asarray(rng.standard_normal((m, K, F)).astype(np.float32))
            res = cp.zeros((m, D), cp.float32)
            # bytes a launch reads: its rows' distinct experts
            nbytes = {kern: np.mean([len(np.unique(i.get())) for i in ids]) * b for kern, b in per_expert.items()}
            for kern in ("gu", "down"):
                for geo in candidates(kern, fmt):
                    if kern == "gu":
                        run = lambda c, geo=geo: cuda_moe.experts_gu(ex, x, ids[c], act, m, K, norm_w=nw, geo=geo)  # noqa: E731
                    else:
                        run = lambda c, geo=geo: cuda_moe.experts_down(ex, act, ids[c], w, None, res, m, K, geo=geo)  # noqa: E731
                    us = time_graph(cp, stream, run, COPIES)
                    star = "*" if geo == cuda_moe.geometry(kern, fmt) else " "
                    desc = " ".join(f"{k[4:]}={v}" for k, v in sorted(geo.items()))
                    print(f"{fmt:5s} m={m} moe_{kern:4s} {star} {desc:32s} {us:7.2f} us {nbytes[kern] / us / 1e3:6.0f} GB/s",
                          flush=True)
        del ex
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
