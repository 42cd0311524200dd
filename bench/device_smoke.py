"""Device smoke test of the whole CUDA runner on small random-weight models: CUDA decode-path
and prefill-path logits against the NumPy reference runner, then the check gates."""
import sys
import time

import numpy as np


def main(formats=("BF16", "Q8_0", "Q4_K")):
    import cupy as cp

    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.numpy_backend import NumpyBackend
    from bw24chat.check import model_gates
    from bw24chat.models import build_model
    from bw24chat.synthetic import synthetic_checkpoint

    rows = []
    for fmt in formats:
        ck = synthetic_checkpoint("tiny", fmt)
        t0 = time.time()
        r = CudaRunner(ck, 1024, "bf16", prefill_chunk=512)
        m = build_model(ck, NumpyBackend())
        ids = np.random.default_rng(0).integers(0, ck.config["vocab_size"], 40)
        ref = m.forward(ids, 0, m.new_cache(), last_only=False)
        dec = np.stack([r.decode_logits(int(t), i) for i, t in enumerate(ids)])
        pre = cp.asnumpy(r.prefill_all(ids, 0))
        e_dec = float(np.linalg.norm(dec - ref) / np.linalg.norm(ref))
        e_pre = float(np.linalg.norm(pre - ref) / np.linalg.norm(ref))
        print(f"{fmt}: rel L2 decode {e_dec:.2e} prefill {e_pre:.2e} argmax agree dec {np.mean(dec.argmax(1) == ref.argmax(1)):.3f} "
              f"pre {np.mean(pre.argmax(1) == ref.argmax(1)):.3f}  ({time.time() - t0:.1f}s)", flush=True)
        for g in model_gates(r, f"tiny/{fmt}"):
            print(("PASS " if g.ok else "FAIL ") + f"{g.section} {g.name}: {g.value}", flush=True)
        del r
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main(tuple(sys.argv[1].split(",")) if len(sys.argv) > 1 else ("BF16", "Q8_0", "Q4_K"))
