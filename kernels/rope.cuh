// rope.cuh — one head vector's QK-norm, RoPE and KV-cache store, as one warp computes them.
// rope.cu's qk_norm_rope_kv_write runs them per (token, head); attention.cu's decode kernel on
// tensor cores runs the very same functions in its prologue when it fuses the step's attention
// prologue (ATTN_ROPE), so both paths give the same bits (tests/gpu/test_attention.py checks it).
// The contract (the math, the store layouts, the NumPy mirrors) is written at the top of rope.cu.
//
// Needs HD (head dim, a multiple of 32, <= 256), NEOX (1 neox / 0 normal pairs), QK_NORM (0/1)
// and KV_TYPE (0 bf16, 1 q8_0, 2 fp8, 3 f32, 255 none).  A head vector lives in one warp as
// x[i] = dim lane + 32 i (ROPE_EPL values per lane).
#include "common.cuh"

#ifndef KV_BF16
#define KV_BF16 0
#define KV_Q8_0 1
#define KV_FP8 2
#define KV_F32 3
#endif
#define KV_NONE 255

#define ROPE_EPL (HD / 32)  // values per lane; lane l holds dims l + 32*i

static_assert(HD % 32 == 0 && HD <= 256, "HD must be a multiple of 32, at most 256");

// float -> E4M3 code, round to nearest even, saturating (PTX cvt, sm_89+)
BW24_DEVICE uint8_t f32_to_e4m3(float x) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return (uint8_t)(r & 0xFF);  // the second source lands in the low byte
}

BW24_DEVICE float warp_max_abs(float v) { return warp_max(fabsf(v)); }

// Store one head vector at cache row `row` (= pos*K + head) of a cache with n_rows = N*K rows.
BW24_DEVICE void kv_store(void* cache, long long row, long long n_rows, const float (&x)[ROPE_EPL], int lane) {
#if KV_TYPE == KV_BF16
    uint16_t* c = (uint16_t*)cache + row * HD;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) c[lane + 32 * i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
#elif KV_TYPE == KV_Q8_0
    int8_t* c = (int8_t*)cache + row * HD;
    __half* sc = (__half*)((uint8_t*)cache + n_rows * HD) + row * (HD / 32);
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) {
        float amax = warp_max_abs(x[i]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        c[lane + 32 * i] = (int8_t)roundf(__fmul_rn(x[i], id));
        if (lane == 0) sc[i] = __float2half_rn(d);
    }
#elif KV_TYPE == KV_FP8
    uint8_t* c = (uint8_t*)cache + row * HD;
    float* sc = (float*)((uint8_t*)cache + n_rows * HD) + row;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
    amax = warp_max(amax);
    float d = amax / 448.0f;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) c[lane + 32 * i] = f32_to_e4m3(d > 0.0f ? x[i] / d : 0.0f);
    if (lane == 0) *sc = d;
#elif KV_TYPE == KV_F32
    (void)n_rows;
    float* c = (float*)cache + row * HD;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) c[lane + 32 * i] = x[i];
#elif KV_TYPE != KV_NONE
#error "KV_TYPE must be 0 (bf16), 1 (q8_0), 2 (fp8), 3 (f32) or 255 (none)"
#endif
}

// x <- rope(rmsnorm(x) * nw) of one q or k head at position row (cr, sr: that position's cos /
// sin table rows).  buf: HD floats of shared memory private to the warp (the pair exchange).
BW24_DEVICE void norm_rope_head(float (&x)[ROPE_EPL], const float* __restrict__ nw, float eps,
                                const float* __restrict__ cr, const float* __restrict__ sr, int rot_dim, float* buf,
                                int lane) {
#if QK_NORM
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    ss = warp_sum(ss);
    const float inv = rms_inv(ss, HD, eps);
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], inv), nw[lane + 32 * i]);
#else
    (void)nw; (void)eps;
#endif
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) buf[lane + 32 * i] = x[i];
    __syncwarp();
    const int half = rot_dim >> 1;
#pragma unroll
    for (int i = 0; i < ROPE_EPL; ++i) {
        const int j = lane + 32 * i;
        if (j < rot_dim) {
#if NEOX
            const int p = j < half ? j : j - half;
            const float a = buf[p], b = buf[p + half];
#else
            const int p = j >> 1;
            const float a = buf[2 * p], b = buf[2 * p + 1];
#endif
            const float c = cr[p], s = sr[p];
            const bool first = NEOX ? (j < half) : ((j & 1) == 0);
            x[i] = first ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        }
    }
    __syncwarp();  // buf may be written again by this warp's next head
}
