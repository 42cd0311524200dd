// gemm_mma.cu — the portable prefill GEMM on tensor cores (mma.sync.m16n8k16 bf16 -> f32, sm_80
// and later): what sm_120a (consumer Blackwell) and BW24CHAT_PORTABLE=1 run, for every weight
// format; on sm_90a only F32 rows of 4k+4 inputs (gemm_wgmma.cu needs 16-byte rows).
//
// Contract: gemm_common.cuh; gemm(wq, wh, ws, wd, gscale, x, out, T, n_out, n_in, epi, xl).  x is
// f32 [T, n_in], split (or rounded) in the A-tile load, or under the integer-dot contract
// (GEMM_XPLANES) its two bf16 code-level planes (x, xl).  GPU test: tests/gpu/test_gemm.py.
// Geometry: block tile 128 (tokens) x 128 (out rows) x 64 (k), 256 threads = 8 warps as 2 (t)
// x 4 (o), warp tile 64 x 32 = 4 x 4 mma tiles; grid (ceil(n_out/128), ceil(T/128)).  The block
// (producer and k loop) is gemm_mma.cuh's, shared with the grouped expert GEMM (moe_group.cu).
// Pipeline: register-staged (the weights need decoding in registers anyway): global loads of k
// tile i+1 go out before the mma work on tile i, then are decoded / converted and stored to the
// other shared buffer; one barrier per k tile.  Shared: 2 x (128 + 128) rows x 72 bf16 (64 + 8
// padding: ldmatrix rows land in distinct banks) = 73,728 bytes, plus the lo tiles when split.
// Napkin math (Qwen3-8B gate|up, T = 512, Q4_K): 2 x 512 x 24576 x 4096 = 103 GFLOP of
// products, x3 MMAs for the hi/lo terms, over 57 MB of Q4_K codes: compute-bound (arithmetic
// intensity ~5000 FLOP/byte); mma.sync's share of the tensor cores' peak is the ceiling.
#include "gemm_mma.cuh"

// gemm's dynamic shared memory (cuda_linear._gemm_smem; tests/test_smem_contract.py)
#define GM_SMEM_BYTES GM_SMEM_BYTES_FOR(GM_BM)

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
     const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
     float* __restrict__ out, int T, int n_out, int n_in, int epi, const __nv_bfloat16* __restrict__ xl) {
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int n0 = blockIdx.x * GM_BN;
    const long m0 = (long)blockIdx.y * GM_BM;
    float acc[GM_BM / 32][4][4];
    gemm_mma_tile<GM_BM / 32, false>(acc, wq, wh, ws, wd, x, xl, DenseRows{m0, T}, n_out, n_in, n0, smem4, GM_BM);

    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < GM_BM / 32; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const long row = m0 + wm * (GM_BM / 2) + mi * 16 + g + (h >> 1) * 8;
                const int col = n0 + wn * 32 + ni * 8 + 2 * t4 + (h & 1);
                if (row < T && col < n_out) gemm_put(out, gscale, row, col, n_out, epi, acc[mi][ni][h]);
            }
}
