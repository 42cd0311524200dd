"""Where prefill and decode part ways (device diagnostic): for a synthetic model and weight
format, the logits and the K/V caches of a from-scratch prefill against a from-scratch decode,
position by position and layer by layer.

    python3 tools/diag_prefill_decode.py q8_0,nvfp4,q4_k [--n 96] [--kv f32]

Prints, per format: the logits' relative difference at the first positions and overall, and per
layer the first position whose K (or V) row differs by more than 1e-6 relative."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rel(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def main() -> int:
    import cupy as cp

    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    ap = argparse.ArgumentParser()
    ap.add_argument("formats")
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--kv", default="f32")
    ap.add_argument("--eager", action="store_true", help="decode without the CUDA graph")
    a = ap.parse_args()
    for fmt in a.formats.split(","):
        ck = synthetic_checkpoint("tiny", fmt.upper())
        r = CudaRunner(ck, 1024, a.kv, prefill_chunk=512)
        prompt = np.random.default_rng(1).integers(0, r.args.vocab_size, a.n)
        pre = cp.asnumpy(r.prefill_all(prompt, 0))
        kv_pre = [(cp.asnumpy(k[: a.n]), cp.asnumpy(v[: a.n])) for k, v in zip(r.cache_k, r.cache_v)]
        r.use_graph, r.graph = not a.eager, None
        dec = np.stack([r.decode_logits(int(t), i) for i, t in enumerate(prompt)])
        kv_dec = [(cp.asnumpy(k[: a.n]), cp.asnumpy(v[: a.n])) for k, v in zip(r.cache_k, r.cache_v)]
        from bw24chat.backends.numpy_backend import NumpyBackend
        from bw24chat.models import build_model

        m = build_model(ck, NumpyBackend(act_quant=True))  # the contract in NumPy (float32)
        ref = m.forward(prompt, 0, m.new_cache(), last_only=False)
        print(f"{fmt}: vs NumPy A8 reference, positions 0-7: GPU prefill " + " ".join(f"{rel(pre[i], ref[i]):.1e}" for i in range(8)) +
              "; GPU decode " + " ".join(f"{rel(dec[i], ref[i]):.1e}" for i in range(8)))
        per_pos = [rel(pre[i], dec[i]) for i in range(a.n)]
        print(f"{fmt}: logits rel diff, positions 0-7: " + " ".join(f"{d:.1e}" for d in per_pos[:8]) +
              f"; max {max(per_pos):.1e} at {int(np.argmax(per_pos))}; argmax differs at {int((pre.argmax(1) != dec.argmax(1)).sum())} of {a.n}")
        for li, ((kp, vp), (kd, vd)) in enumerate(zip(kv_pre, kv_dec)):
            kp, vp, kd, vd = (x.reshape(a.n, -1).view(np.uint8) if x.dtype == np.uint8 else x.reshape(a.n, -1) for x in (kp, vp, kd, vd))
            if kp.dtype != np.float32:
                print(f"  layer {li}: cache bytes differ at {int((kp != kd).any(1).sum())} K rows, {int((vp != vd).any(1).sum())} V rows")
                continue
            dk = [rel(kd[i], kp[i]) for i in range(a.n)]
            dv = [rel(vd[i], vp[i]) for i in range(a.n)]
            first = lambda d: next((i for i, x in enumerate(d) if x > 1e-6), None)  # noqa: E731
            print(f"  layer {li}: K first >1e-6 at {first(dk)} (max {max(dk):.1e}, pos0 {dk[0]:.1e}), V first at {first(dv)} (max {max(dv):.1e}, pos0 {dv[0]:.1e})")
        del r
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
