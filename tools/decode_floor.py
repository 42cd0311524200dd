"""What a decode-sized kernel can reach at best on this GPU (device):

    python3 tools/decode_floor.py

Two floors the in-step matvec times of `bw24chat bench --profile` are read against:
  1. the launch floor: an empty kernel, 200 back-to-back launches captured in one CUDA graph;
  2. the streaming floor: a kernel that only reads S bytes (16-byte loads, 4 in flight per
     thread, grid-stride, one xor-folded word written per block so nothing is elided), for the
     byte counts of the Qwen3-8B decode matrices in BF16 and NVFP4, launched back to back over
     COPIES buffers (together past the 60 MB L2) inside one graph; grids of k blocks per SM.
Median of 7 timings of 10 graph replays (CUDA events).  Prints us per launch and GB/s.
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

SRC = r"""
extern "C" __global__ void empty_kernel(int* p) { if (p && threadIdx.x == 1024) p[0] = 0; }

extern "C" __global__ void __launch_bounds__(256) stream_read(const uint4* __restrict__ src, long n16, unsigned int* out) {
    unsigned int acc = 0;
    const long stride = (long)gridDim.x * blockDim.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(src + i + u * stride));
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) { const uint4 v = src[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}
"""

SIZES_MB = {"nvfp4 o 4096x4096": 9.44, "nvfp4 qkv 6144x4096": 14.16, "nvfp4 down 4096x12288": 28.31,
            "bf16 o 4096x4096": 33.55, "nvfp4 gate|up 24576x4096": 56.62, "bf16 qkv": 50.33,
            "bf16 down": 100.66, "bf16 gate|up": 201.33}
COPIES = 6


def time_graph(cp, stream, launch, copies):
    """us per launch of launch(0..copies-1) captured in one CUDA graph (launch(0) first runs
    once outside the capture: compiles, sets attributes): median of 7 timings of 10 replays."""
    with stream:
        launch(0)
        stream.synchronize()
        stream.begin_capture()
        for c in range(copies):
            launch(c)
        g = stream.end_capture()
    for _ in range(2):
        g.launch(stream)
    ts = []
    for _ in range(7):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        for _ in range(10):
            g.launch(stream)
        b.record(stream)
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / (10 * copies))
    return statistics.median(ts)


def main() -> int:
    import cupy as cp

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    empty, read = mod.get_function("empty_kernel"), mod.get_function("stream_read")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    stream = cp.cuda.Stream(non_blocking=True)
    null = np.uint64(0)
    us = time_graph(cp, stream, lambda c: empty((1,), (32,), (null,)), 200)
    print(f"empty kernel, 200 launches in one graph: {us:.2f} us per launch")
    us = time_graph(cp, stream, lambda c: empty((sms * 4,), (256,), (null,)), 200)
    print(f"empty kernel, {sms * 4} blocks x 256: {us:.2f} us per launch")
    out = cp.zeros(sms * 64, cp.uint32)
    for name, mb in SIZES_MB.items():
        n16 = int(mb * 1e6) // 16
        bufs = [cp.asarray(np.random.default_rng(c).integers(0, 2**32, n16 * 4, dtype=np.uint32)) for c in range(COPIES)]
        res = []
        for k in (2, 4, 8, 16):
            us = time_graph(cp, stream, lambda c: read((sms * k,), (256,), (bufs[c], np.int64(n16), out)), COPIES)
            res.append(f"{k:2d}/SM {us:7.2f} us {n16 * 16 / us / 1e3:5.0f} GB/s")
        print(f"{name:26s} {mb:7.2f} MB  " + "  ".join(res), flush=True)
        del bufs
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
