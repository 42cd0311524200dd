// deltanet_common.cuh — what the gated delta rule's two forms (deltanet.cu's recurrence, the
// decode and short-prefill path; deltanet_chunk.cu's chunked prefill) compute alike: a row's
// normalized q and k, and its gates.  One definition, so that both forms start from the same bits.
#pragma once
#include "common.cuh"

#ifndef DK
#define DK 128
#endif
#define DKP ((DK + 31) / 32 * 32)  // DK padded to whole 32-lane groups (zeros beyond DK)
#define NRM (DKP / 32)             // values a lane sums for S(q), S(k)

static_assert(DK >= 1 && DK <= 256, "DK: 1..256");

// dst[i] = (x[i] / sqrt(S(x) + 1e-6)) * scale for i < DK, zeros up to DKP (one warp; S: the sum of
// squares, lane l adding x[l]^2, x[l + 32]^2, ... in order, then the 32-lane butterfly).
BW24_DEVICE void l2norm_row(const float* __restrict__ x, float* __restrict__ dst, float scale, int lane) {
    float v[NRM];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < NRM; ++u) {
        const int i = lane + 32 * u;
        v[u] = i < DK ? x[i] : 0.0f;
        ss = __fadd_rn(ss, __fmul_rn(v[u], v[u]));
    }
    ss = warp_sum(ss);
    const float nrm = __fsqrt_rn(__fadd_rn(ss, 1e-6f));
#pragma unroll
    for (int u = 0; u < NRM; ++u) dst[lane + 32 * u] = __fmul_rn(__fdiv_rn(v[u], nrm), scale);
}

// g = A * softplus(a + dt_bias), the log of the row's decay exp(g) (softplus as torch's: x above
// 20, else log1pf(expf(x))); beta = sigmoid(b) is common.cuh's.
BW24_DEVICE float gdn_log_decay(float a, float dt_bias, float A) {
    const float x = __fadd_rn(a, dt_bias);
    const float sp = x > 20.0f ? x : log1pf(expf(fminf(x, 20.0f)));
    return __fmul_rn(A, sp);
}
