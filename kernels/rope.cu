// rope.cu — the fused per-token attention prologue: optional per-head RMSNorm of q and k
// (Qwen3 QK-norm), RoPE of q and k, and the write of k and v into the layer's KV cache.
// One launch per layer per step instead of four (norm q, norm k, rope, kv write): at ~1 µs per
// graph node that is the point of fusing.
//
// Shape legend: T tokens, H query heads, K kv heads, HD head dim, R rotary dims (R <= HD, even),
// N cache positions (n_ctx).
//
// Contract (mirrors bw24chat/models/base.py + numpy_backend.py + rope.py):
//   for t < T, slot in [0, H+2K):
//     slot <  H      : x = q[t, slot]          -> [rmsnorm(x) * q_norm_w] -> rope -> q[t, slot]   (in place)
//     slot <  H+K    : x = k[t, slot-H]        -> [rmsnorm(x) * k_norm_w] -> rope -> k[t, slot-H] (in place)
//                                                  and cache_k[positions[t], slot-H] = store(x)
//     otherwise      : x = v[t, slot-H-K]      -> cache_v[positions[t], slot-H-K] = store(x)
//   rmsnorm(x) = (x * (1 / sqrtf(sum(x*x)/HD + eps))) * w   (NumpyBackend.rmsnorm)
//     sum order: lane l sums x[l], x[l+32], ... in order, then a 32-lane xor butterfly.
//   rope (rope.apply_rope, cos/sin tables float32 [n_pos, R/2] built by rope.build_rope_table):
//     neox   : pair (i, i+R/2);  normal: pair (2i, 2i+1);  a' = a*c - b*s,  b' = b*c + a*s
//     written with __fmul_rn/__fsub_rn/__fadd_rn so that no FMA contraction happens: the rotated
//     values equal NumPy's bit for bit (tests/gpu/test_ops_norm_rope.py checks bit equality).
//     Dims R..HD-1 pass through.
//   store (layouts in bw24chat/backends/kernel_refs.py, which is the NumPy reference):
//     bf16 : __float2bfloat16_rn
//     q8_0 : per 32 dims (= one register index across the warp): d = amax/127, id = d ? 1/d : 0,
//            code = roundf(x*id), f16 d  (ggml quantize_row_q8_0_ref)
//     fp8  : per head vector: d = amax/448, code = cvt.rn.satfinite.e4m3(x / d) (0 when d == 0)
//     f32  : x itself (the exact reference cache)
//   Positions >= n_ctx are not written (the caller sizes the cache).
//
// Launch geometry: one warp per (t, slot); 128-thread blocks (4 warps);
//   grid = ceil(T*(H+2K) / 4); no shared memory beyond 4*HD floats (static).
// Defines: HD (head dim, multiple of 32, <= 256), NEOX (1 neox / 0 normal), QK_NORM (0/1),
//          KV_TYPE (0 bf16, 1 q8_0, 2 fp8, 3 f32, 255 none: only q and k are rotated in place).
#include "common.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef NEOX
#define NEOX 1
#endif
#ifndef QK_NORM
#define QK_NORM 0
#endif
#include "kv_types.cuh"
#define KV_NONE 255

#define EPL (HD / 32)  // values per lane; lane l holds dims l + 32*i
#define WARPS 4

static_assert(HD % 32 == 0 && HD <= 256, "HD must be a multiple of 32, at most 256");

// float -> E4M3 code, round to nearest even, saturating (PTX cvt, sm_89+)
BW24_DEVICE uint8_t f32_to_e4m3(float x) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return (uint8_t)(r & 0xFF);  // the second source lands in the low byte
}

BW24_DEVICE float warp_max_abs(float v) { return warp_max(fabsf(v)); }

// Store one head vector (lane-strided registers x[i] = dim lane + 32 i) at cache row `row`
// (= pos*K + head) of a cache with N*K rows.
BW24_DEVICE void kv_store(void* cache, long long row, long long n_rows, const float (&x)[EPL], int lane) {
#if KV_TYPE == KV_BF16
    uint16_t* c = (uint16_t*)cache + row * HD;
#pragma unroll
    for (int i = 0; i < EPL; ++i) c[lane + 32 * i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
#elif KV_TYPE == KV_Q8_0
    int8_t* c = (int8_t*)cache + row * HD;
    __half* sc = (__half*)((uint8_t*)cache + n_rows * HD) + row * (HD / 32);
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
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
    for (int i = 0; i < EPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
    amax = warp_max(amax);
    float d = amax / 448.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) c[lane + 32 * i] = f32_to_e4m3(d > 0.0f ? x[i] / d : 0.0f);
    if (lane == 0) *sc = d;
#elif KV_TYPE == KV_F32
    (void)n_rows;
    float* c = (float*)cache + row * HD;
#pragma unroll
    for (int i = 0; i < EPL; ++i) c[lane + 32 * i] = x[i];
#elif KV_TYPE != KV_NONE
#error "KV_TYPE must be 0 (bf16), 1 (q8_0), 2 (fp8), 3 (f32) or 255 (none)"
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
qk_norm_rope_kv_write(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                      const float* __restrict__ q_norm_w, const float* __restrict__ k_norm_w, float eps,
                      const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                      const int* __restrict__ positions, int rot_dim, int T, int H, int K,
                      void* __restrict__ cache_k, void* __restrict__ cache_v, int n_ctx,
                      int stride_q, int stride_k, int stride_v, const float* __restrict__ bias,
                      float* __restrict__ q_out) {
    // The inputs that no kernel of the step writes — the position (copied in before the step's
    // first kernel), the norm weights, the cos / sin rows, the biases — are read before pdl_wait,
    // while the qkv matvec still finishes, so the post-wait path is one round trip for x (the
    // cos / sin reads depended on the position's: two round trips after the wait before).
    pdl_trigger();
    // q_out: optional contiguous (T, H, HD) destination of the rotated q (the attention kernels
    // read q densely); null: q is rotated in place.
    // stride_*: floats between consecutive tokens' rows (lets q, k, v be column slices of one
    // fused qkv matvec output).  bias: optional [(H + 2K) * HD] q|k|v projection biases
    // (Qwen2), added before the QK-norm and RoPE, as the reference adds them in linear().
    __shared__ float buf[WARPS][HD];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int slots = H + 2 * K;
    const long long item = (long long)blockIdx.x * WARPS + w;
    if (item >= (long long)T * slots) return;
    const int t = (int)(item / slots), slot = (int)(item % slots);
    const int kind = slot < H ? 0 : slot < H + K ? 1 : 2;  // q, k, v
    const int pos = positions[t];
    const int half = rot_dim >> 1;
    float nwv[EPL], bv[EPL], cv[EPL], sv[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int j = lane + 32 * i;
#if QK_NORM
        nwv[i] = kind < 2 ? (kind == 0 ? q_norm_w : k_norm_w)[j] : 0.0f;
#else
        nwv[i] = 0.0f;
#endif
        bv[i] = bias != nullptr ? bias[(long long)slot * HD + j] : 0.0f;
#if NEOX
        const int p = j < half ? j : j - half;
#else
        const int p = j >> 1;
#endif
        const bool rot = kind < 2 && j < rot_dim;
        cv[i] = rot ? cos_t[(long long)pos * half + p] : 0.0f;
        sv[i] = rot ? sin_t[(long long)pos * half + p] : 0.0f;
    }
    pdl_wait();  // q, k, v come from the qkv matvec

    float* src = kind == 0 ? q + (long long)t * stride_q + (long long)slot * HD
               : kind == 1 ? k + (long long)t * stride_k + (long long)(slot - H) * HD
                           : (float*)v + (long long)t * stride_v + (long long)(slot - H - K) * HD;
    float x[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) x[i] = src[lane + 32 * i];
    if (bias != nullptr) {
#pragma unroll
        for (int i = 0; i < EPL; ++i) x[i] = __fadd_rn(x[i], bv[i]);
        if (kind == 2) {  // v is not rotated: store the biased value back for the attention to read
#pragma unroll
            for (int i = 0; i < EPL; ++i) src[lane + 32 * i] = x[i];
        }
    }

    if (kind < 2) {
#if QK_NORM
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < EPL; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
        ss = warp_sum(ss);
        const float inv = rms_inv(ss, HD, eps);
#pragma unroll
        for (int i = 0; i < EPL; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], inv), nwv[i]);
#else
        (void)nwv; (void)q_norm_w; (void)k_norm_w; (void)eps;
#endif
#pragma unroll
        for (int i = 0; i < EPL; ++i) buf[w][lane + 32 * i] = x[i];
        __syncwarp();
#pragma unroll
        for (int i = 0; i < EPL; ++i) {
            const int j = lane + 32 * i;
            if (j < rot_dim) {
#if NEOX
                const int p = j < half ? j : j - half;
                const float a = buf[w][p], b = buf[w][p + half];
#else
                const int p = j >> 1;
                const float a = buf[w][2 * p], b = buf[w][2 * p + 1];
#endif
                const float c = cv[i], s = sv[i];
                const bool first = NEOX ? (j < half) : ((j & 1) == 0);
                x[i] = first ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
            }
        }
        float* dst = (kind == 0 && q_out != nullptr) ? q_out + ((long long)t * H + slot) * HD : src;
#pragma unroll
        for (int i = 0; i < EPL; ++i) dst[lane + 32 * i] = x[i];
    }
#if KV_TYPE != KV_NONE
    if (kind > 0 && pos >= 0 && pos < n_ctx) {
        const int head = kind == 1 ? slot - H : slot - H - K;
        kv_store(kind == 1 ? cache_k : cache_v, (long long)pos * K + head, (long long)n_ctx * K, x, lane);
    }
#endif
}
