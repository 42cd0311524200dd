"""Decode matvec variants on the Qwen3-8B projection shapes, timed inside CUDA graphs (device):

    python3 bench/matvec_variants.py [--formats nvfp4,bf16]

For each shape (qkv 6144x4096, o 4096x4096, gate|up 24576x4096, down 4096x12288, LM head
49152x4096), COPIES random weight copies (together well past the 60 MB L2) are launched back to
back in one captured graph (rmsnorm prologue where the decode step has one), replayed 10 times
between CUDA events; median of 7.  Variants are selected through the wrappers' environment
switches (BW24CHAT_MATVEC, BW24CHAT_TC_NW, BW24CHAT_TC_U, BW24CHAT_MV_U,
BW24CHAT_MV_PERSIST), so the kernels timed
are the ones the engine runs.  Prints us per launch and GB/s of weight bytes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_floor import format_bench_setup, reset_switches, time_graph  # noqa: E402  (shared by the bench scripts)

SHAPES = {"qkv": (6144, 4096, "rmsnorm"), "o": (4096, 4096, "none"), "gate|up": (24576, 4096, "rmsnorm"),
          "down": (4096, 12288, "none"), "lm_head": (49152, 4096, "rmsnorm")}
VARIANTS = {
    "BF16": [("auto", {}), ("tc", {"BW24CHAT_MATVEC": "tc"}), ("simt unsteady", {"BW24CHAT_MATVEC": "simt", "BW24CHAT_MV_STEADY": "0"})],
    "Q8_0": [("int-dot auto", {}), ("int-dot unsteady", {"BW24CHAT_MV_STEADY": "0"})],
    "Q4_K": [("int-dot auto", {}), ("joined levels", {"BW24CHAT_A8_JOIN": "1"}),
             ("joined minb2", {"BW24CHAT_A8_JOIN": "1", "BW24CHAT_MV_MINB": "2", "BW24CHAT_MV_STEADY": "1"})],
    "NVFP4": [("int-dot auto", {}), ("int-dot unsteady", {"BW24CHAT_MV_STEADY": "0"}),
              ("int-dot steady", {"BW24CHAT_MV_STEADY": "1"}),
              ("minb2 u2", {"BW24CHAT_MV_STEADY": "1", "BW24CHAT_MV_MINB": "2", "BW24CHAT_MV_U": "2"}),
              ("minb2 u3", {"BW24CHAT_MV_STEADY": "1", "BW24CHAT_MV_MINB": "2", "BW24CHAT_MV_U": "3"}),
              ("minb3 u2", {"BW24CHAT_MV_STEADY": "1", "BW24CHAT_MV_MINB": "3", "BW24CHAT_MV_U": "2"}),
              ("minb3 u2 nr4", {"BW24CHAT_MV_STEADY": "1", "BW24CHAT_MV_MINB": "3", "BW24CHAT_MV_U": "2", "BW24CHAT_A8_NR": "4"})],
}
COPIES = 6


def _variants(fmt: str) -> list:
    """VARIANTS[fmt], or the list in BW24CHAT_MV_VARIANTS ("label:KEY=V,KEY=V;label2:..." with the
    BW24CHAT_ prefix left out of the keys) for every format: one-off comparisons without an edit."""
    spec = os.environ.get("BW24CHAT_MV_VARIANTS", "")
    if not spec:
        return VARIANTS.get(fmt, [("default", {})])
    out = []
    for item in spec.split(";"):
        label, _, kv = item.partition(":")
        out.append((label, {f"BW24CHAT_{k}": v for k, v in (p.split("=") for p in kv.split(",") if "=" in p)}))
    return out


def main() -> int:
    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import repack_host, upload
    from bw24chat.backends.kernel_build import KernelCompileError
    from bw24chat.synthetic import random_matrix

    cp, formats, rng, stream = format_bench_setup("nvfp4,bf16")
    rows = []
    for fmt in formats:
        for name, (out, in_, pro) in SHAPES.items():
            t = random_matrix(fmt, out, in_, rng)
            hp = repack_host([t])
            Ws = [upload([t], hp) for _ in range(COPIES)]
            x = cp.asarray(rng.standard_normal((1, in_)).astype(np.float32))
            nw = cp.asarray(rng.uniform(0.5, 1.5, in_).astype(np.float32))
            y = cp.empty((1, out), cp.float32)
            for label, env in _variants(fmt):
                reset_switches()
                os.environ.update(env)
                try:  # a variant the wrapper refuses or NVRTC cannot build is reported, not fatal
                    us = time_graph(cp, stream, lambda c: lin.matvec(Ws[c], x, y, 1, prologue=pro, norm_w=nw), COPIES)
                except (KernelCompileError, ValueError) as e:
                    print(f"{fmt:6} {name:8} {label:12} n/a: {str(e).splitlines()[0][:120]}", flush=True)
                    continue
                gbs = Ws[0].nbytes / (us * 1e-6) / 1e9
                rows.append((fmt, name, label, us, gbs))
                print(f"{fmt:6} {name:8} {label:12} {us:8.2f} us {gbs:7.0f} GB/s", flush=True)
            del Ws
            cp.get_default_memory_pool().free_all_blocks()
    reset_switches()
    print("\nbest per shape:")
    for fmt in sorted({r[0] for r in rows}):
        for name in SHAPES:
            cand = [r for r in rows if r[0] == fmt and r[1] == name]
            if cand:
                b = min(cand, key=lambda r: r[3])
                print(f"  {fmt:6} {name:8} {b[2]:12} {b[3]:8.2f} us {b[4]:7.0f} GB/s   (" +
                      ", ".join(f"{r[2]} {r[3]:.1f}" for r in cand) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
