"""The integer-dot decode matvec of m rows on this GPU (device): the SIMT kernel (matvec.cu, what
decode and verify run today) against the tensor-core one (matvec_mma.cu, cuda_linear impl "mma"):

    python3 tools/matvec_mma_timing.py [--formats q8_0,nvfp4,q4_k] [--rows 1-8] [--shapes o,gate|up] [--sweep]
                                       [--ranges 2,3]

Rows past 8 (up to 16: the batched pass's spans) run on matvec_mma only (the SIMT kernel takes 8).

Qwen3-8B's decode matrices on synthetic weights (bw24chat.synthetic): qkv 6144 x 4096 (rmsnorm),
o 4096 x 4096 (x codes from a QX buffer, add), gate|up 24576 x 4096 (rmsnorm, swiglu, writing the
down projection's QX codes), down 4096 x 12288 (QX codes, add), the LM head 151936 x 4096
(rmsnorm), each prologue / QX use as the decode step makes it for that kernel and row count
(cuda_linear.takes_qx / writes_qx, mma_plan / mma_writes_qx).  Each matvec_mma line names its
plan: its K ranges (k-tile bounds; the down projection splits at m = 7..16 on an H100, in 3 from
m = 14), the ring depth and, where the rows run in groups, the rows per launch.  Per matrix, format, m and kernel:
us per call, the median of 7 timings of 10 replays of one CUDA graph of COPIES launches over
copies of the weights (so that a graph reads more than the L2 holds; decode_floor.time_graph),
after one warm-up launch and two warm-up replays.  Then the matvec part of one decode step (36
layers of qkv + o + gate|up + down, one LM head) in ms, and its ratio to the SIMT one-row step
(with --shapes, of the shapes timed).
--sweep: matvec_mma's other geometries too (MV_NW, MQ_KW, MQ_STAGES; MATVEC_MMA_TUNING's pick
marked *).  --ranges: matvec_mma over these numbers of K ranges too (the shapes of prologue qx / none: o, down;
mma_plan's ring depth for each; a count whose ranges' x does not fit at m is left out).  Every kernel,
geometry and split gives the same bits (tests/gpu/test_matvec_mma.py).
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from decode_floor import time_graph  # tools/ (this script's folder) is on sys.path

LAYERS = 36
SHAPES = [  # (name, rows, inputs, per step)
    ("qkv", 6144, 4096, LAYERS), ("o", 4096, 4096, LAYERS), ("gate|up", 24576, 4096, LAYERS),
    ("down", 4096, 12288, LAYERS), ("lm_head", 151936, 4096, 1)]
GRAPH_BYTES = 256e6  # weight bytes one timed graph reads at least (H100 L2: 50 MB)


def parse_rows(s: str) -> list[int]:
    if "-" in s:
        a, b = s.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(v) for v in s.split(",")]


def sweep_geometries(m: int) -> list[dict]:
    """MATVEC_MMA_TUNING's entry for m rows first, then the alternatives."""
    from bw24chat.backends import cuda_linear as cl

    pick = cl.MATVEC_MMA_TUNING[("*", cl.mma_class(m))]
    out = [pick]
    for nw in (8, 16):
        for kw in (4, 8):
            for stages in (3, 4, 6, 8):
                g = {"MV_NW": nw, "MQ_KW": kw, "MQ_STAGES": stages, "MV_MINB": 2 if nw == 8 else 1}
                if g != pick:
                    out.append(g)
    return out


def plan_label(cl, W, m: int, prologue: str, ranges: int | None = None) -> str:
    """matvec_mma's plan for this call, in words: its K ranges, ring stages, rows per launch."""
    p = cl.mma_plan(W, m, prologue, ranges)
    split = f"{p.ranges} K ranges {'/'.join(map(str, p.kt_bounds))}" if p.ranges > 1 else "1 range"
    return f"[{split}, {p.defines['MQ_STAGES']} stages" + (f", {p.m_fit} rows a launch]" if p.m_fit < m else "]")


def fits(cl, W, m: int, prologue: str, ranges: int) -> bool:
    """Whether matvec_mma can run m rows of W over this many K ranges (their x beside the ring)."""
    try:
        cl.mma_plan(W, m, prologue, ranges)
    except ValueError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="q8_0,nvfp4,q4_k")
    ap.add_argument("--rows", default="1-8", help="m values (1..16): a range 1-8 or a list 1,2,4,8")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="a subset of " + ",".join(s[0] for s in SHAPES))
    ap.add_argument("--sweep", action="store_true", help="time matvec_mma's other geometries too")
    ap.add_argument("--ranges", default="", help="time matvec_mma over these numbers of K ranges too (o, down): 2,3")
    args = ap.parse_args()
    extra_ranges = [int(v) for v in args.ranges.split(",") if v]

    import cupy as cp

    from bw24chat.backends import cuda_linear as cl
    from bw24chat.backends import cuda_weights as cw
    from bw24chat.backends.kernel_refs import qx_ref, qx_row_words
    from bw24chat.synthetic import random_matrix

    rows_list = parse_rows(args.rows)
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.cuda.Device()
    print(f"{cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {dev.attributes['MultiProcessorCount']} SMs; "
          f"us per call (median of 7 x 10 graph replays)", flush=True)
    for fmt in [f.strip().upper() for f in args.formats.split(",")]:
        step = {}  # (kernel, m) -> us of the matvec part of a decode step
        for name, n_out, n_in, per_step in [sh for sh in SHAPES if sh[0] in args.shapes.split(",")]:
            W0 = cw.upload([random_matrix(fmt, n_out, n_in, rng)])
            copies = max(1, min(8, math.ceil(GRAPH_BYTES / W0.nbytes)))
            Ws = [W0] + [cw.DeviceWeight(W0.fmt, W0.out, W0.in_, *(None if a is None else a.copy() for a in (W0.q, W0.h, W0.s, W0.d, W0.gscale)),
                                         W0.global_scale, W0.nbytes, W0.fmt_id, W0.vpc) for _ in range(copies - 1)]
            swiglu = name == "gate|up"
            for m in rows_list:
                x = cp.asarray(rng.standard_normal((m, n_in)).astype(np.float32))
                norm_w = cp.asarray(rng.uniform(0.5, 1.5, n_in).astype(np.float32))
                out = cp.zeros((m, n_out // 2 if swiglu else n_out), cp.float32)
                qx_in = cp.asarray(qx_ref(cp.asnumpy(x))) if name in ("o", "down") else None
                qx_out = cp.zeros((m, qx_row_words(n_out // 2)), cp.uint32) if swiglu else None

                takes_qx = {impl: name in ("o", "down") and cl.takes_qx(W0, m, impl=impl) for impl in ("simt", "mma")}
                prologue = "qx" if takes_qx["mma"] else "none" if name in ("o", "down") else "rmsnorm"

                def launcher(impl: str, k_ranges: int | None = None):
                    if name in ("o", "down"):  # x codes from the producer where this kernel takes them
                        kw = dict(prologue="qx", qx_in=qx_in) if takes_qx[impl] else {}
                        if impl == "mma":
                            kw["k_ranges"] = k_ranges
                        return lambda c: cl.matvec(Ws[c], x, out, m, epilogue="add", impl=impl, **kw)
                    if swiglu:
                        writes = cl.writes_qx(W0, m, impl=impl)
                        return lambda c: cl.matvec(Ws[c], x, out, m, "rmsnorm", "swiglu", norm_w=norm_w, impl=impl,
                                                   qx_out=qx_out if writes else None)
                    return lambda c: cl.matvec(Ws[c], x, out, m, "rmsnorm", norm_w=norm_w, impl=impl)

                res = []
                for impl in ("simt", "mma") if m <= cl.MV_MAX_ROWS else ("mma",):
                    geos = sweep_geometries(m) if impl == "mma" and args.sweep else [None]
                    for gi, geo in enumerate(geos):
                        saved = dict(cl.MATVEC_MMA_TUNING)
                        if geo is not None:
                            cl.MATVEC_MMA_TUNING[("*", cl.mma_class(m))] = geo
                        try:
                            us = time_graph(cp, stream, launcher(impl), copies)
                        finally:
                            cl.MATVEC_MMA_TUNING.clear()
                            cl.MATVEC_MMA_TUNING.update(saved)
                        if gi == 0:
                            step[(impl, m)] = step.get((impl, m), 0.0) + per_step * us
                        label = impl if geo is None else "mma " + " ".join(f"{k}={v}" for k, v in geo.items()) + (" *" if gi == 0 else "")
                        if impl == "mma" and geo is None:
                            label += " " + plan_label(cl, W0, m, prologue)
                        res.append(f"{label} {us:8.2f} us {W0.nbytes / us / 1e3:5.0f} GB/s")
                for r in [r for r in extra_ranges if name in ("o", "down") and fits(cl, W0, m, prologue, r)]:
                    us = time_graph(cp, stream, launcher("mma", r), copies)
                    res.append(f"mma {plan_label(cl, W0, m, prologue, r)} {us:8.2f} us {W0.nbytes / us / 1e3:5.0f} GB/s")
                print(f"{fmt:5s} {name:8s} {n_out:6d} x {n_in:5d} m={m}  " + "  ".join(res[:2]), flush=True)
                for r in res[2:]:
                    print(f"{'':38s}{r}", flush=True)
            Ws = W0 = None  # this shape's weights freed before the next one's
            cp.get_default_memory_pool().free_all_blocks()
        base = step.get(("simt", 1))
        print(f"{fmt}: the matvec part of one decode step ({LAYERS} layers + LM head), ms (x the SIMT one-row step):")
        for m in rows_list:
            cells = [f"{impl} {step[(impl, m)] / 1e3:7.3f}" + (f" ({step[(impl, m)] / base:4.2f}x)" if base else "")
                     for impl in ("simt", "mma") if (impl, m) in step]
            print(f"  m={m}  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
