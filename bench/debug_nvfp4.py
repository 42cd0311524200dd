"""Print the first NVFP4 dequantization mismatches between the device and quants.dequantize."""
import numpy as np


def main():
    import cupy as cp

    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import upload
    from bw24chat.synthetic import random_matrix
    from bw24chat.loaders.tensor import QTensor

    rng = np.random.default_rng(0)
    for case in ("sane", "random-bytes"):
        t = random_matrix("NVFP4", 8, 128, rng)
        if case == "random-bytes":
            t = QTensor("w", "NVFP4", (8, 128), rng.integers(0, 256, (8, 2 * 36), dtype=np.uint8), global_scale=0.37)
        W = upload([t])
        out = cp.full((8, 128), np.nan, cp.float32)
        lin.dequantize(W, out)
        got = cp.asnumpy(out)
        ref = t.dequantize()
        bad = np.argwhere(got.view(np.uint32) != ref.view(np.uint32))
        print(case, "mismatches", len(bad))
        raw = np.asarray(t.raw).reshape(8, -1, 36)
        for r, c in bad[:12]:
            blk = raw[r, c // 64]
            sb = blk[(c % 64) // 16]
            q = blk[4 + ((c % 64) // 16) * 8 + (c % 8)]
            code = (q >> 4) if (c % 16) >= 8 else (q & 15)
            print(f"  [{r},{c}] got {got[r, c]!r} ({got[r, c].view(np.uint32):08x}) ref {ref[r, c]!r} ({ref[r, c].view(np.uint32):08x}) scale byte {sb:#04x} code {code}")


if __name__ == "__main__":
    main()
