// rope.cu — the fused per-token attention prologue: optional RMSNorm of q and k (QK-norm: per
// head, Qwen3 / GLM-4.5; or over the whole q and k projections, MiniMax-M2), RoPE of q and k, and
// the write of k and v into the layer's KV cache.
// One launch per layer per step instead of four (norm q, norm k, rope, kv write): at ~1 µs per
// graph node that is the point of fusing.
//
// Shape legend: T tokens, H query heads, K kv heads, HD head dim, R rotary dims (R <= HD, even),
// N cache positions (n_ctx).
//
// Contract (mirrors bw24chat/models/dense.py + numpy_backend.py rope_kv + rope.py):
//   for t < T, slot in [0, H+2K):
//     slot <  H      : x = q[t, slot]          -> [qk-norm] -> rope -> q[t, slot]   (in place)
//     slot <  H+K    : x = k[t, slot-H]        -> [qk-norm] -> rope -> k[t, slot-H] (in place)
//                                                  and cache_k[positions[t], slot-H] = store(x)
//     otherwise      : x = v[t, slot-H-K]      -> cache_v[positions[t], slot-H-K] = store(x)
//   qk-norm (QK_NORM):
//     0  none
//     1  per head (Qwen3): x * rms_inv(S(x), HD) * w[j], w (HD,) shared by the heads
//     2  full (MiniMax-M2, transformers MiniMaxM2Attention: q_norm = RMSNorm(H * HD)): every head
//        of row t's q by rms_inv(S(q head 0) + S(q head 1) + ... + S(q head H-1), H*HD), times
//        q_norm_w[slot*HD + j]; k alike over its K heads with k_norm_w (K*HD,).  Split by heads
//        over GPUs (cuda_sharded.py; ss_mode, n_q, n_k): ss_mode 1 only writes the row's two sums
//        over its own heads (q, k; left to right from 0) to ss_io[2t], [2t + 1]; the caller
//        all-reduces them; ss_mode 2 takes those totals instead of its own sums.  Either way the
//        mean square divides by the model's n_q * HD, n_k * HD (ss_mode 0: n_q = H, n_k = K)
//     S(x) = the head's sum of squares: lane l sums x[l]^2, x[l+32]^2, ... in order (each square
//            rounded, then added), then a 32-lane xor butterfly (offsets 16, 8, 4, 2, 1); full
//            mode adds the heads' S left to right from 0 (kernel_refs.qk_norm_ref states this
//            order in NumPy).  A row's result depends on that row alone, never on T or on which
//            block ran it: decode rows and prefill rows agree bit for bit.
//     rms_inv(s, n) = 1 / sqrtf(s / n + eps) (common.cuh; NumpyBackend.rmsnorm's formula)
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
//   cache_rows (optional, int32 [T]): the cache row of token t instead of positions[t] (a paged
//   pool: the row of position p is its block's first row + p % block size, kv_pages.py; the
//   rotation still uses positions[t]).  Rows outside [0, n_ctx) are not written.
//
// Launch geometry:
//   qk_norm_rope_kv_write (QK_NORM 0 / 1): one warp per (t, slot); 128-thread blocks (4 warps);
//     grid = ceil(T*(H+2K) / 4); no shared memory beyond 4*HD floats (static).
//   qk_fullnorm_rope_kv_write (QK_NORM 2): one block per token (grid = T), NW = ceil((H+2K) /
//     FN_SPW) <= 16 warps; warp w holds slots w, w + NW, ... (FN_SPW of them) in registers from
//     one load, so each value is read once: the per-head sums meet in shared memory, two lanes
//     of warp 0 add them (q's H, k's K: ~H dependent adds, 0.1-0.2 µs), then every warp scales,
//     rotates and stores its slots.  MiniMax-M2 (H 48, K 8, HD 128): 64 slots, 16 warps x 4;
//     a row moves 2 x 36 KB (f32 q, k, v in and out) plus its cache rows.
// Defines: HD (head dim, multiple of 32, <= 256), NEOX (1 neox / 0 normal), QK_NORM (0 / 1 / 2),
//          KV_TYPE (0 bf16, 1 q8_0, 2 fp8, 3 f32, 255 none: only q and k are rotated in place),
//          FN_SPW (QK_NORM 2: slots per warp), Q_GATED (1: q's heads are 2 HD apart, each [q |
//          output gate] as Qwen3-Next's gated attention lays out its q projection (ops.AttentionSpec
//          output_gate); the rotated q goes to q_out, the gate halves are not touched).
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
#ifndef FN_SPW
#define FN_SPW 1
#endif
#ifndef Q_GATED
#define Q_GATED 0
#endif
#include "kv_types.cuh"
#define KV_NONE 255

#define EPL (HD / 32)  // values per lane; lane l holds dims l + 32*i
#define WARPS 4
#define FN_MAX_WARPS 16

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

// The inputs of one (t, slot) that no kernel of the step writes — the norm weights, the bias,
// the cos / sin rows at the token's position — read before pdl_wait, while the qkv matvec still
// finishes, so the post-wait path is one round trip for x.
struct SlotConsts {
    float nw[EPL], b[EPL], c[EPL], s[EPL];
};

BW24_DEVICE int slot_kind(int slot, int H, int K) { return slot < H ? 0 : slot < H + K ? 1 : 2; }  // q, k, v

BW24_DEVICE void slot_consts(SlotConsts& sc, int slot, int H, int K, int pos, int rot_dim, const float* q_norm_w,
                             const float* k_norm_w, const float* bias, const float* cos_t, const float* sin_t, int lane) {
    const int kind = slot_kind(slot, H, K);
    const int half = rot_dim >> 1;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int j = lane + 32 * i;
#if QK_NORM == 1
        sc.nw[i] = kind < 2 ? (kind == 0 ? q_norm_w : k_norm_w)[j] : 0.0f;
#elif QK_NORM == 2
        sc.nw[i] = kind == 0 ? q_norm_w[(long long)slot * HD + j] : kind == 1 ? k_norm_w[(long long)(slot - H) * HD + j] : 0.0f;
#else
        (void)q_norm_w; (void)k_norm_w;
        sc.nw[i] = 0.0f;
#endif
        sc.b[i] = bias != nullptr ? bias[(long long)slot * HD + j] : 0.0f;
#if NEOX
        const int p = j < half ? j : j - half;
#else
        const int p = j >> 1;
#endif
        const bool rot = kind < 2 && j < rot_dim;
        sc.c[i] = rot ? cos_t[(long long)pos * half + p] : 0.0f;
        sc.s[i] = rot ? sin_t[(long long)pos * half + p] : 0.0f;
    }
}

// The (t, slot) head vector's place: q, k or v are column slices of one fused qkv output
// (stride_*: floats between consecutive tokens' rows).
BW24_DEVICE float* slot_src(float* q, float* k, const float* v, int t, int slot, int H, int K, int stride_q,
                            int stride_k, int stride_v) {
    const int kind = slot_kind(slot, H, K);
    return kind == 0 ? q + (long long)t * stride_q + (long long)slot * (HD << Q_GATED)
         : kind == 1 ? k + (long long)t * stride_k + (long long)(slot - H) * HD
                     : (float*)v + (long long)t * stride_v + (long long)(slot - H - K) * HD;
}

// x = the head vector (+ its bias: Qwen2, GLM-4.5, added before the QK-norm and RoPE as the
// reference adds them in linear()); a biased v is stored back for the attention to read.
BW24_DEVICE void slot_load(float (&x)[EPL], float* src, const SlotConsts& sc, bool biased, int kind, int lane) {
#pragma unroll
    for (int i = 0; i < EPL; ++i) x[i] = src[lane + 32 * i];
    if (biased) {
#pragma unroll
        for (int i = 0; i < EPL; ++i) x[i] = __fadd_rn(x[i], sc.b[i]);
        if (kind == 2) {
#pragma unroll
            for (int i = 0; i < EPL; ++i) src[lane + 32 * i] = x[i];
        }
    }
}

// S(x): the head's sum of squares in the contract's order (every lane gets it)
BW24_DEVICE float head_sum_sq(const float (&x)[EPL]) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    return warp_sum(ss);
}

BW24_DEVICE void norm_scale(float (&x)[EPL], float inv, const float (&nw)[EPL]) {
#pragma unroll
    for (int i = 0; i < EPL; ++i) x[i] = __fmul_rn(__fmul_rn(x[i], inv), nw[i]);
}

// RoPE of x in place; `row`: this warp's HD floats of shared memory, through which the pairs meet.
BW24_DEVICE void rope_rotate(float (&x)[EPL], const SlotConsts& sc, float* row, int rot_dim, int lane) {
    const int half = rot_dim >> 1;
#pragma unroll
    for (int i = 0; i < EPL; ++i) row[lane + 32 * i] = x[i];
    __syncwarp();
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int j = lane + 32 * i;
        if (j < rot_dim) {
#if NEOX
            const int p = j < half ? j : j - half;
            const float a = row[p], b = row[p + half];
#else
            const int p = j >> 1;
            const float a = row[2 * p], b = row[2 * p + 1];
#endif
            const float c = sc.c[i], s = sc.s[i];
            const bool first = NEOX ? (j < half) : ((j & 1) == 0);
            x[i] = first ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        }
    }
    __syncwarp();  // the row buffer may be refilled next
}

// The rotated q (to q_out: a contiguous (T, H, HD), or in place) and k (in place); k and v into the cache.
BW24_DEVICE void slot_store(const float (&x)[EPL], float* src, float* q_out, int t, int slot, int H, int K, int row,
                            void* cache_k, void* cache_v, int n_ctx, int lane) {
    // row: the token's cache row (its position, or cache_rows[t])
    const int kind = slot_kind(slot, H, K);
    if (kind < 2) {
        float* dst = (kind == 0 && q_out != nullptr) ? q_out + ((long long)t * H + slot) * HD : src;
#pragma unroll
        for (int i = 0; i < EPL; ++i) dst[lane + 32 * i] = x[i];
    }
#if KV_TYPE != KV_NONE
    if (kind > 0 && row >= 0 && row < n_ctx) {
        const int head = kind == 1 ? slot - H : slot - H - K;
        kv_store(kind == 1 ? cache_k : cache_v, (long long)row * K + head, (long long)n_ctx * K, x, lane);
    }
#else
    (void)cache_k; (void)cache_v; (void)n_ctx; (void)row;
#endif
}

// Arguments of both kernels: q_out: optional contiguous (T, H, HD) destination of the rotated q
// (the attention kernels read q densely); null: q is rotated in place.  stride_*: floats between
// consecutive tokens' rows.  bias: optional [(H + 2K) * HD] q|k|v projection biases.
// cache_rows: optional [T] cache rows (null: positions).
#if QK_NORM < 2
extern "C" __global__ void __launch_bounds__(WARPS * 32)
qk_norm_rope_kv_write(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                      const float* __restrict__ q_norm_w, const float* __restrict__ k_norm_w, float eps,
                      const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                      const int* __restrict__ positions, int rot_dim, int T, int H, int K,
                      void* __restrict__ cache_k, void* __restrict__ cache_v, int n_ctx,
                      int stride_q, int stride_k, int stride_v, const float* __restrict__ bias,
                      float* __restrict__ q_out, const int* __restrict__ cache_rows) {
    pdl_trigger();
    __shared__ float buf[WARPS][HD];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int slots = H + 2 * K;
    const long long item = (long long)blockIdx.x * WARPS + w;
    if (item >= (long long)T * slots) return;
    const int t = (int)(item / slots), slot = (int)(item % slots);
    const int kind = slot_kind(slot, H, K);
    const int pos = positions[t];  // copied in before the step's first kernel
    const int crow = cache_rows != nullptr ? cache_rows[t] : pos;
    SlotConsts sc;
    slot_consts(sc, slot, H, K, pos, rot_dim, q_norm_w, k_norm_w, bias, cos_t, sin_t, lane);
    pdl_wait();  // q, k, v come from the qkv matvec

    float* src = slot_src(q, k, v, t, slot, H, K, stride_q, stride_k, stride_v);
    float x[EPL];
    slot_load(x, src, sc, bias != nullptr, kind, lane);
    if (kind < 2) {
#if QK_NORM
        norm_scale(x, rms_inv(head_sum_sq(x), HD, eps), sc.nw);
#else
        (void)eps;
#endif
        rope_rotate(x, sc, buf[w], rot_dim, lane);
    }
    slot_store(x, src, q_out, t, slot, H, K, crow, cache_k, cache_v, n_ctx, lane);
}
#else
extern "C" __global__ void __launch_bounds__(FN_MAX_WARPS * 32)
qk_fullnorm_rope_kv_write(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                          const float* __restrict__ q_norm_w, const float* __restrict__ k_norm_w, float eps,
                          const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                          const int* __restrict__ positions, int rot_dim, int T, int H, int K,
                          void* __restrict__ cache_k, void* __restrict__ cache_v, int n_ctx,
                          int stride_q, int stride_k, int stride_v, const float* __restrict__ bias,
                          float* __restrict__ q_out, const int* __restrict__ cache_rows, float* __restrict__ ss_io,
                          int ss_mode, int n_q, int n_k) {
    pdl_trigger();
    __shared__ float buf[FN_MAX_WARPS][HD];
    __shared__ float head_ss[FN_MAX_WARPS * FN_SPW];  // S of each q and k head of the row
    __shared__ float inv_s[2];  // q's and k's rms_inv
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int slots = H + 2 * K;
    const int t = blockIdx.x;
    (void)T;
    const int pos = positions[t];
    const int crow = cache_rows != nullptr ? cache_rows[t] : pos;
    SlotConsts sc[FN_SPW];
#pragma unroll
    for (int s = 0; s < FN_SPW; ++s) {
        const int slot = w + nw * s;
        if (slot < slots) slot_consts(sc[s], slot, H, K, pos, rot_dim, q_norm_w, k_norm_w, bias, cos_t, sin_t, lane);
    }
    pdl_wait();

    float x[FN_SPW][EPL];
#pragma unroll
    for (int s = 0; s < FN_SPW; ++s) {
        const int slot = w + nw * s;
        if (slot < slots) {
            const int kind = slot_kind(slot, H, K);
            slot_load(x[s], slot_src(q, k, v, t, slot, H, K, stride_q, stride_k, stride_v), sc[s], bias != nullptr, kind, lane);
            if (kind < 2 && ss_mode != 2) {
                const float ss = head_sum_sq(x[s]);
                if (lane == 0) head_ss[slot] = ss;
            }
        }
    }
    __syncthreads();
    if (w == 0 && lane < 2) {  // lane 0: q over its H heads, lane 1: k over its K heads, left to right
        const int n = lane == 0 ? H : K, base = lane == 0 ? 0 : H;
        float ss = 0.0f;
        if (ss_mode == 2) {
            ss = ss_io[2 * t + lane];
        } else {
            for (int h = 0; h < n; ++h) ss = __fadd_rn(ss, head_ss[base + h]);
        }
        if (ss_mode == 1) ss_io[2 * t + lane] = ss;
        inv_s[lane] = rms_inv(ss, (lane == 0 ? n_q : n_k) * HD, eps);
    }
    if (ss_mode == 1) return;  // the whole block: its row's two partial sums are out
    __syncthreads();
#pragma unroll
    for (int s = 0; s < FN_SPW; ++s) {
        const int slot = w + nw * s;
        if (slot < slots) {
            const int kind = slot_kind(slot, H, K);
            float* src = slot_src(q, k, v, t, slot, H, K, stride_q, stride_k, stride_v);
            if (kind < 2) {
                norm_scale(x[s], inv_s[kind], sc[s].nw);
                rope_rotate(x[s], sc[s], buf[w], rot_dim, lane);
            }
            slot_store(x[s], src, q_out, t, slot, H, K, crow, cache_k, cache_v, n_ctx, lane);
        }
    }
}
#endif
