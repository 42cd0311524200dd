"""Does the KV cache layout bound the long decode-attention row?  (device)  python3 bench/kv_layout_probe.py

Reads the K and V bytes one decode-attention layer reads at L keys (Qwen3-8B: 8 kv heads x 128
dims, bf16) the way attn_decode_tc's blocks do — block (split s, kv head h) streams keys
[s*L/S, (s+1)*L/S) of head h, 256-byte rows at a 2 KB stride in today's [pos][kv head][dim]
layout — against a head-major [kv head][pos][dim] layout (each block's keys contiguous), at
S = 8 and 16 splits.  No arithmetic: the loads only (16 bytes per thread, 8 in flight), summed
so the compiler keeps them.  36 layers' worth of distinct buffers per graph-less timing loop (no
L2 reuse); CUDA events, median of 7."""
import sys

import numpy as np

SRC = r"""
extern "C" __global__ void __launch_bounds__(256) kv_read(const uint4* __restrict__ k, const uint4* __restrict__ v,
        int L, int K, int nsplit, int head_major, unsigned* __restrict__ sink) {
    const int s = blockIdx.x, h = blockIdx.y;
    const int per = (L + nsplit - 1) / nsplit, k0 = s * per, k1 = min(L, k0 + per);
    unsigned acc = 0;
    // 16 uint4 per 256-byte key row of one head; 256 threads = 16 keys per pass, 8 passes in flight
    const int kk = threadIdx.x >> 4, c = threadIdx.x & 15;
    for (int j0 = k0; j0 < k1; j0 += 128) {
        uint4 a[8], b[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int j = j0 + u * 16 + kk;
            const long long row = head_major ? ((long long)h * L + j) : ((long long)j * K + h);
            a[u] = j < k1 ? k[row * 16 + c] : make_uint4(0, 0, 0, 0);
            b[u] = j < k1 ? v[row * 16 + c] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= a[u].x ^ a[u].w ^ b[u].y ^ b[u].z;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
"""


def main() -> int:
    import cupy as cp

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    kern = mod.get_function("kv_read")
    K, HD, layers = 8, 128, 36
    sink = cp.zeros(1, cp.uint32)
    for L in (2048, 8192):
        n = L * K * HD * 2 // 16  # uint4 per plane
        bufs = [(cp.random.randint(0, 2**31, n * 4, dtype=cp.int32).view(cp.uint32),
                 cp.random.randint(0, 2**31, n * 4, dtype=cp.int32).view(cp.uint32)) for _ in range(layers)]
        mb = 2 * L * K * HD * 2 / 1e6
        for nsplit in (8, 16, 32):
            for hm in (0, 1):
                def run():
                    for kb, vb in bufs:
                        kern((nsplit, K), (256,), (kb, vb, np.int32(L), np.int32(K), np.int32(nsplit), np.int32(hm), sink))
                run()
                ts = []
                for _ in range(7):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(); run(); e1.record(); e1.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / layers)
                us = float(np.median(ts))
                print(f"L={L:5d} splits={nsplit:2d} {'head-major' if hm else 'pos-major '} {us:7.2f} us/layer  "
                      f"{mb / us * 1e3:6.0f} GB/s  ({mb:.1f} MB)", flush=True)
        del bufs
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
