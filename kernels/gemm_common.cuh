// gemm_common.cuh — what the prefill GEMMs share (gemm_mma.cu, gemm_wgmma.cu, gemm_i8.cu):
// the precision switches, the block tile, the cp.async forms on 32-bit shared addresses and the
// epilogue.
//
// Contract (every GEMM): out[t, o] (= or +=) y[t, o], y = gs[o] * sum_k W[o, k] x[t, k] with f32
// accumulation, t < T, o < n_out; W[o, k] = the exact f32 value of formats.cuh decode_exact
// (bit-equal to quants.dequantize); gs = gscale[o] (NVFP4 global scale) or 1.  No split-K: every
// output's k order is the fixed sequence of 64-wide k tiles, each four k16 steps in order, so a
// row's values do not depend on T or on the row's place in its tile.
// Precision (GEMM_SPLIT, default 1): x enters as two bf16 planes, x_hi = bf16(x) and x_lo =
// bf16(x - x_hi) ("bf16x2", Markidis et al. 2018), or under the integer-dot contract as its two
// exact code levels (gemm_act.cu act_quant); each k16 step adds x_hi.W then x_lo.W into the same
// accumulator: the activation rounding error drops from ~2^-9 to ~2^-17, so prefill follows the
// f32 decode path.  Weights whose exact values are not bf16 numbers (F32, F16, the
// integer-scaled formats; not BF16, nor NVFP4 whose E2M1 x E4M3 products have <= 6 significant
// bits, nor MXFP4's E2M1 x 2^k with <= 2) are split too (W_SPLIT): a third term x_hi.W_lo
// (x_lo.W_lo is dropped: 1.6e-5..4.2e-5 of a row's largest value for Q8_0).  GEMM_SPLIT=0:
// x = bf16(x) as one plane, the bf16-activation contract (W split as ever).
// NumPy reference: x (or bf16(x), act_quant_ref(x)) @ W.T in float64 (tests/gpu/test_gemm.py).
#pragma once
#include "common.cuh"
#include "formats.cuh"

#ifndef GEMM_SPLIT
#define GEMM_SPLIT 1
#endif
#define W_SPLIT (FMT != F_BF16 && FMT != F_NVFP4 && FMT != F_MXFP4)
#define GM_BM 128
#define GM_BN 128
#define GM_BK 64
#define GM_LD (GM_BK + 8)
#define GM_NT 256
#define GM_CPR (GM_BK / VPC)                  // weight chunks per row per k tile

// cp.async to a 32-bit shared address, zero-filled when !full (the ring kernels' copies)
BW24_DEVICE void cp_async16(uint32_t dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
BW24_DEVICE void cp_async4(uint32_t dst, const void* src, bool full) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(full ? 4 : 0) : "memory");
}

// Which x row feeds tile row r of a GEMM block (piece j of the thread's loads): row(j, r), read
// only where ok(j, r) (else zeros).  DenseRows: rows m0 + r below T (the dense GEMMs); RowTable:
// one gathered row per piece, looked up once per block (-1: none; moe_group.cu: the rows of one
// expert in the grouped order).
struct DenseRows {
    long m0;
    int T;
    BW24_DEVICE bool ok(int, int r) const { return m0 + r < T; }
    BW24_DEVICE long row(int, int r) const { return m0 + r; }
};
template <int N>
struct RowTable {
    long v[N];
    BW24_DEVICE bool ok(int j, int) const { return v[j] >= 0; }
    BW24_DEVICE long row(int j, int) const { return v[j]; }
};

// the epilogue of one output: gs[col] scale, then store or add (ldo: out's row stride)
BW24_DEVICE void gemm_put(float* __restrict__ out, const float* __restrict__ gscale, long row, int col, int ldo, int epi, float v) {
    if (gscale) v = __fmul_rn(v, gscale[col]);
    float* dst = out + row * ldo + col;
    *dst = epi ? __fadd_rn(*dst, v) : v;
}
