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
#ifndef HD
#define HD 128
#endif
#ifndef NEOX
#define NEOX 1
#endif
#ifndef QK_NORM
#define QK_NORM 0
#endif
#ifndef KV_TYPE
#define KV_TYPE 0
#endif
// norm_rope_head, kv_store: shared with attention.cu's fused decode prologue (ATTN_ROPE)
#include "rope.cuh"

#define EPL ROPE_EPL
#define WARPS 4

extern "C" __global__ void __launch_bounds__(WARPS * 32)
qk_norm_rope_kv_write(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                      const float* __restrict__ q_norm_w, const float* __restrict__ k_norm_w, float eps,
                      const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                      const int* __restrict__ positions, int rot_dim, int T, int H, int K,
                      void* __restrict__ cache_k, void* __restrict__ cache_v, int n_ctx,
                      int stride_q, int stride_k, int stride_v, const float* __restrict__ bias,
                      float* __restrict__ q_out) {
    PDL_ENTRY();
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
    const int pos = positions[t];

    float* src;
    const float* nw = nullptr;
    int kind;  // 0 q, 1 k, 2 v
    if (slot < H) {
        src = q + (long long)t * stride_q + (long long)slot * HD; kind = 0; nw = q_norm_w;
    } else if (slot < H + K) {
        src = k + (long long)t * stride_k + (long long)(slot - H) * HD; kind = 1; nw = k_norm_w;
    } else {
        src = (float*)v + (long long)t * stride_v + (long long)(slot - H - K) * HD; kind = 2;
    }
    float x[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) x[i] = src[lane + 32 * i];
    if (bias != nullptr) {
#pragma unroll
        for (int i = 0; i < EPL; ++i) x[i] = __fadd_rn(x[i], bias[(long long)slot * HD + lane + 32 * i]);
        if (kind == 2) {  // v is not rotated: store the biased value back for the attention to read
#pragma unroll
            for (int i = 0; i < EPL; ++i) src[lane + 32 * i] = x[i];
        }
    }

    if (kind < 2) {
        const int half = rot_dim >> 1;
        norm_rope_head(x, nw, eps, cos_t + (long long)pos * half, sin_t + (long long)pos * half, rot_dim, buf[w], lane);
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
