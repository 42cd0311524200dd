"""Where prefill GEMM time goes, per call, on two Qwen3-8B shapes at T = 512 (device):

    python3 bench/prefill_probe.py [--formats q8_0,nvfp4] [--dequant-only]

Times (us, median of 7) the activation passes alone (split_bf16, act_quant), the weight
dequantization pass alone (dequant_bf16 over the whole matrix in the GEMM's row blocks, hi plane
only: what the precise NVFP4 and every fast mode pay; GB/s of bytes read + written), and
lin.gemm for each format in the precise / fast modes, with the integer-dot contract on (default)
and off (BW24CHAT_A8=none): once inside a CUDA graph (GPU time) and once launched from the host in
a loop between events (what an eager prefill pays, host launches included)."""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_floor import format_bench_setup, time_graph  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate|up": (24576, 4096), "down": (4096, 12288)}
T = 512


def time_eager(cp, stream, launch, n=10):
    with stream:
        launch()
        stream.synchronize()
        ts = []
        for _ in range(7):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            for _ in range(n):
                launch()
            b.record(stream)
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / n)
    return statistics.median(ts)


def main() -> int:
    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends.cuda_weights import upload
    from bw24chat.synthetic import random_matrix

    dequant_only = "--dequant-only" in sys.argv  # the dequantization pass alone, every shape
    if dequant_only:
        sys.argv.remove("--dequant-only")
    cp, formats, rng, stream = format_bench_setup("q8_0,nvfp4")
    for name, (out, in_) in SHAPES.items():
        x = cp.asarray(rng.standard_normal((T, in_)).astype(np.float32))
        n = T * in_
        for label, fn in () if dequant_only else (("split_bf16 hi+lo", lambda: lin._bf16_planes(x, n, True)), ("act_quant bf16", lambda: lin._act_quant(x, n))):
            g = time_graph(cp, stream, lambda c: fn(), 1)
            e = time_eager(cp, stream, fn)
            print(f"{name:5} {label:28} graph {g:8.1f} us  eager {e:8.1f} us", flush=True)
        for fmt in formats:
            W = upload([random_matrix(fmt, out, in_, rng)])
            y = cp.empty((T, out), cp.float32)
            if fmt not in ("BF16", "F32"):
                rows = lin.dequant_block_rows(W)
                whi = cp.empty(rows * in_, cp.uint16)

                def deq_pass():
                    for r0 in range(0, out, rows):
                        lin.dequant_block(W, r0, min(rows, out - r0), whi, None)
                g = time_graph(cp, stream, lambda c: deq_pass(), 1)
                gbs = (W.nbytes + 2 * out * in_) / (g * 1e-6) / 1e9
                print(f"{name:5} {fmt:6} dequant pass (hi)            graph {g:8.1f} us ({gbs:5.0f} GB/s)", flush=True)
                del whi
            if dequant_only:
                continue
            for a8 in ("", "none"):
                os.environ["BW24CHAT_A8"] = a8
                for precise in (True, False):
                    fn = lambda: lin.gemm(W, x, y, T, precise=precise)  # noqa: E731
                    g = time_graph(cp, stream, lambda c: fn(), 1)
                    e = time_eager(cp, stream, fn)
                    tf = 2 * T * out * in_ / (g * 1e-6) / 1e12
                    print(f"{name:5} {fmt:6} a8={'on' if not a8 else 'off':3} {'precise' if precise else 'fast':7}   graph {g:8.1f} us"
                          f" ({tf:5.0f} TF)  eager {e:8.1f} us", flush=True)
            os.environ.pop("BW24CHAT_A8", None)
            del W
    return 0


if __name__ == "__main__":
    sys.exit(main())
