// matvec_common.cuh — what the two decode matvec kernels share (matvec.cu: SIMT, matvec_tc.cu:
// tensor cores): the tokens per launch, the prologue / epilogue codes of their common contract
// (matvec.cu's header; cuda_linear.PROLOGUES / EPILOGUES / PRO_BF16 mirror them) and rmsnorm's
// per-value step; and the SIMT kernel's block (its warps, the threads that sum the rmsnorm
// statistic) and statistic step, which its float path and its integer-dot staging
// (matvec_a8.cuh) both read.
#pragma once
#include "common.cuh"
#include "formats.cuh"

#ifndef MV_M  // tokens (rows of x) per launch, 1..8 (matvec_mma.cu: 1..16)
#define MV_M 1
#endif

#ifndef MV_NW  // warps per block, 8 or 16: every block quantizes / stages the whole x in its prologue,
// so one block of 16 warps per SM does that once per SM instead of twice.  The rows' values do not
// depend on it (per-lane chunk order, warp_sum; the x codes are per 32 inputs); the rmsnorm
// statistic's order does, hence MV_STAT8.
#define MV_NW 8
#endif
#if MV_NW != 8 && MV_NW != 16
#error "MV_NW: 8 or 16 warps per block"
#endif
#ifndef MV_STAT8  // 1 (16 warps only): the rmsnorm statistic is summed by the first 8 warps in the
// 8-warp kernel's order, so a 16-warp block gives the 8-warp kernel's rows bit for bit with the
// rmsnorm prologue too (the staging after it uses every warp)
#define MV_STAT8 0
#endif
#if MV_STAT8 && MV_NW != 16
#error "MV_STAT8: the 8-warp statistic inside a 16-warp block"
#endif
#define MV_NT (MV_NW * 32)
#define STAT_NT (MV_STAT8 ? 256 : MV_NT)  // threads that sum the rmsnorm statistic
#define STAT_NW (STAT_NT / 32)

#define PRO_NONE 0
#define PRO_RMS 1
#define PRO_SWIGLU 2
#define PRO_QX 3    // matvec.cu ACT_Q8 only: x's codes ready-made
#define PRO_BF16 8  // flag: the matmul input rounded to bf16 (the bf16-activation contract)
#define EPI_STORE 0
#define EPI_ADD 1
#define EPI_SWIGLU 2  // rows interleaved gate_i, up_i: out[m, i] = silu(y[2i]) * y[2i+1]

// rmsnorm applied to one value: (x * inv) * w, the order numpy_backend.rmsnorm uses
BW24_DEVICE float rms_apply(float v, float inv, float w) { return __fmul_rn(__fmul_rn(v, inv), w); }

// s plus the squares of NR float4 groups, in the order (i, x, y, z, w) by FMA: one step of the
// rmsnorm statistic, the same in the float path (rms_inv_rows) and the integer-dot one (stage_a8)
template <int NR>
BW24_DEVICE float add_squares(const float4 (&v)[NR], float s) {
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        s = __fmaf_rn(v[i].x, v[i].x, s);
        s = __fmaf_rn(v[i].y, v[i].y, s);
        s = __fmaf_rn(v[i].z, v[i].z, s);
        s = __fmaf_rn(v[i].w, v[i].w, s);
    }
    return s;
}
