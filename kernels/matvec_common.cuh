// matvec_common.cuh — what the two decode matvec kernels share (matvec.cu: SIMT, matvec_tc.cu:
// tensor cores): the tokens per launch, the prologue / epilogue codes of their common contract
// (matvec.cu's header; cuda_linear.PROLOGUES / EPILOGUES / PRO_BF16 mirror them) and rmsnorm's
// per-value step.
#pragma once
#include "common.cuh"
#include "formats.cuh"

#ifndef MV_M  // tokens (rows of x) per launch, 1..8
#define MV_M 1
#endif

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
