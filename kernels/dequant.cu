// dequant.cu — whole-tensor dequantization and embedding gather, bit-exact with
// bw24chat.quants.dequantize (times the NVFP4 global scale, as QTensor.dequantize does).
//
// Contract
//   dequant_rows(wq, wh, ws, wd, gscale, ids, lo, n_table, n_rows, n_in, out)
//     out[t, :] = W[row(t), :] as float32, row(t) = ids[t] - lo (ids int32) or t when ids == nullptr,
//     t = 0..n_rows-1; out is [n_rows, n_in] row-major.  With n_table >= 0, a row(t) outside
//     [0, n_table) gives zeros: an embedding split by vocabulary over several GPUs (parallel.py)
//     holds ids [lo, lo + n_table) and adds nothing for the others (the all-reduce after it then
//     sums one row and zeros: exact).  n_table < 0: every id is a row of the table (one GPU).
//   W is a repacked matrix (kernels/formats.cuh, bw24chat/backends/cuda_weights.py), FMT one
//   format per compile; gscale is the per-row NVFP4 global scale (nullptr for other formats).
// Math: formats.cuh decode_exact (the float ops of quants.py / ggml-quants.c in their order, no
// FMA), then one rounded multiply by gscale[row] (QTensor.dequantize: out * float32(gs)).
//   dequant_bf16(wq, wh, ws, wd, row0, n_rows, n_in, hi, lo)
//     hi[t, :] = bf16(W[row0 + t, :]), lo[t, :] = bf16(W - hi) when lo != nullptr (the prefill
//     GEMM's weight planes, gemm_wgmma.cu gemm_wgp; no global scale: the GEMM epilogue applies it).
// Launch: 1-D grid-stride, 256 threads, one 16-byte chunk (VPC values) per thread-iteration;
// dequant_rows: each thread writes its VPC values as 16-byte stores; dequant_bf16: each warp
// writes its 32 chunks' run through shared memory (below).
#include "common.cuh"
#include "formats.cuh"

// the grid-stride walk shared by both kernels: chunk kc of row row_of(t), t < n_rows, decoded to
// its exact values v[VPC] (formats.cuh decode_exact), handed to put(t, row, kc, v)
template <class RowOf, class Put>
BW24_DEVICE void for_each_chunk(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
                                const void* __restrict__ wd, int n_rows, int n_in, RowOf row_of, Put put) {
    const int nck = n_in / VPC;
    const long total = (long)n_rows * nck;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long t = i / nck;
        const int kc = (int)(i - t * nck);
        const long row = row_of(t);
        if (row < 0) continue;  // dequant_rows: an id outside the table's range (zeros written there)
        Raw r;
        fetch_chunk(r, wq, wh, ws, wd, row, nck, kc);
        float v[VPC];
        decode_exact(r, kc, v);
        put(t, row, kc, v);
    }
}

extern "C" __global__ void __launch_bounds__(256)
dequant_rows(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
             const void* __restrict__ wd, const float* __restrict__ gscale, const int* __restrict__ ids,
             long lo, long n_table, int n_rows, int n_in, float* __restrict__ out) {
    PDL_ENTRY();
    if (ids && n_table >= 0) {  // the ids outside the table's range: zero rows (the walk below skips them)
        const long nck4 = (long)n_rows * (n_in / 4);
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < nck4; i += (long)gridDim.x * blockDim.x) {
            const long t = i / (n_in / 4), row = (long)ids[t] - lo;
            if (row < 0 || row >= n_table)
                reinterpret_cast<float4*>(out + t * n_in)[i - t * (n_in / 4)] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    for_each_chunk(wq, wh, ws, wd, n_rows, n_in, [&](long t) {
            if (!ids) return t;
            const long row = (long)ids[t] - lo;
            return n_table < 0 || (row >= 0 && row < n_table) ? row : -1L;
        },
                   [&](long t, long row, int kc, float (&v)[VPC]) {
        if (gscale) {
            const float gs = gscale[row];
#pragma unroll
            for (int e = 0; e < VPC; ++e) v[e] = __fmul_rn(v[e], gs);
        }
        float4* o = reinterpret_cast<float4*>(out + t * n_in + (long)kc * VPC);
#pragma unroll
        for (int e = 0; e < VPC; e += 4) o[e >> 2] = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    });
}

// dequant_bf16: rows [row0, row0 + n_rows) as bf16 planes for the prefill GEMM (gemm_wgmma.cu
// gemm_wgp): hi[t, k] = bf16(W[row0 + t, k]) and, when lo != null, lo[t, k] = bf16(W - hi) — the
// values gemm_mma.cu's TileStager stages (the NVFP4 global scale is left to the GEMM epilogue).
// Chunk i's values land at plane offset i * VPC (the rows are dense), so a warp's 32 consecutive
// chunks fill 32 * VPC contiguous values: each lane puts its chunk's bf16 words in a per-warp
// shared buffer and the warp stores the run with consecutive 16-byte units per lane, every sector
// written whole by one instruction (measured 2x the bandwidth of each lane storing its own chunk,
// a warp instruction half-writing 32 sectors; docs/performance.md).
#ifndef DEQ_LO
#define DEQ_LO 1  // 0: compiled for hi alone (lo must be null): 48 registers instead of 80 (NVFP4)
#endif
BW24_DEVICE void bf16_chunk(const float (&v)[VPC], bool want_lo, uint32_t (&h)[VPC / 2], uint32_t (&l)[VPC / 2]) {
#pragma unroll
    for (int e = 0; e < VPC; e += 4) {
        uint2 a, b;
        split_bf16x4(make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]), a, b);
        h[e / 2] = a.x;
        h[e / 2 + 1] = a.y;
        l[e / 2] = want_lo ? b.x : 0u;
        l[e / 2 + 1] = want_lo ? b.y : 0u;
    }
}

extern "C" __global__ void __launch_bounds__(256)
dequant_bf16(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
             const void* __restrict__ wd, long row0, int n_rows, int n_in, __nv_bfloat16* __restrict__ hi,
             __nv_bfloat16* __restrict__ lo) {
    PDL_ENTRY();
    constexpr int WORDS = VPC / 2;          // u32 words (bf16 pairs) per chunk and plane
    constexpr int UW = WORDS >= 4 ? 4 : 2;  // words per store unit (16 bytes; F32 chunks: 8)
    constexpr int G = WORDS / UW;           // units per chunk
    // per warp (256 threads), one plane at a time; chunk c's unit g at unit slot c * G + (g ^ (c % G))
    // (XOR swizzle: the lanes' unit writes spread over the banks, the warp's reads stay whole units)
    __shared__ __align__(16) uint32_t stage[8][32 * WORDS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nck = n_in / VPC;
    const long total = (long)n_rows * nck;
    const long stride = (long)gridDim.x * blockDim.x;
    // warp-uniform walk: the warp's chunks base .. base + 31, lane's chunk base + lane
    for (long base = (long)blockIdx.x * blockDim.x + 32 * warp; base < total; base += stride) {
        const long i = base + lane;
        const int nvalid = (int)min(32L, total - base);
        uint32_t h[WORDS], l[WORDS];
        if (i < total) {
            const long t = i / nck;
            const int kc = (int)(i - t * nck);
            Raw r;
            fetch_chunk(r, wq, wh, ws, wd, row0 + t, nck, kc);
            float v[VPC];
            decode_exact(r, kc, v);
            bf16_chunk(v, DEQ_LO && lo != nullptr, h, l);
        }
        for (int plane = 0; plane < (DEQ_LO && lo ? 2 : 1); ++plane) {
            if (i < total) {
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    uint32_t* slot = stage[warp] + (lane * G + (g ^ (lane % G))) * UW;
                    if constexpr (UW == 4)
                        *reinterpret_cast<uint4*>(slot) = plane ? make_uint4(l[4 * g], l[4 * g + 1], l[4 * g + 2], l[4 * g + 3])
                                                                : make_uint4(h[4 * g], h[4 * g + 1], h[4 * g + 2], h[4 * g + 3]);
                    else
                        *reinterpret_cast<uint2*>(slot) = plane ? make_uint2(l[2 * g], l[2 * g + 1]) : make_uint2(h[2 * g], h[2 * g + 1]);
                }
            }
            __syncwarp();
            uint32_t* dst = reinterpret_cast<uint32_t*>(plane ? lo : hi) + base * WORDS;
            for (int u = lane; u < nvalid * G; u += 32) {
                const int c = u / G, g = u % G;
                const uint32_t* slot = stage[warp] + (c * G + (g ^ (c % G))) * UW;
                if constexpr (UW == 4)
                    reinterpret_cast<uint4*>(dst)[u] = *reinterpret_cast<const uint4*>(slot);
                else
                    reinterpret_cast<uint2*>(dst)[u] = *reinterpret_cast<const uint2*>(slot);
            }
            __syncwarp();
        }
    }
}
