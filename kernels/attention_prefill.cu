// attention_prefill.cu — causal prefill attention on tensor cores (FlashAttention-2 structure,
// mma.sync m16n8k16 bf16, f32 accumulators) over the KV cache of any type (attention_kv.cuh).
//
// Contract: queries t < T at positions start+t (start a plain int: prefill is not graph-captured)
// attend keys 0..start+t (already written by rope.cu qk_norm_rope_kv_write).  NumPy references:
// kernel_refs.attention_ref (float64 on the dequantized cache: rel. L2 <= 1e-4) and
// attention_flash_ref(..., operands="bf16x2"), which emulates the operand rounding; GPU test:
// tests/gpu/test_attention.py.
// Rows of a block are the (token, head) pairs i = t*GQ + g of one kv head's head group, BM = 64
// rows (4 warps x 16), so the GQ heads share every K/V tile.  Key blocks of BN = 64 at absolute
// multiples of 64, always visited 0, 1, 2, ...: a key block entirely in a row's future leaves that
// row's state bit-unchanged (alpha = exp2(0) = 1, p = 0), so each row's result is identical
// whatever the prefill chunking (tests check 256- vs 512-token chunks bit for bit).
// Grid (ceil(T*GQ/64), K*NSG) (x reversed: the longest tiles start first), 128 threads, dynamic
// shared memory PREFILL_STAGES x tiles x 64 x (HD+8) bf16 (cuda_ops.prefill_smem_bytes): tiles =
// K, V, or with KV_SPLIT K_hi, V_hi, K_lo, V_lo (139264 B at HD=128 with two stages).
// bf16 caches: tiles by cp.async.  q8_0/fp8/f32: each value is loaded and dequantized to its exact
// f32 value (code * scale, as the reference) and stored (KV_SPLIT) as bf16 hi = bf16(v) and
// lo = bf16(v - hi) tiles, so K and V are exact to 2^-17 like Q and P.
// Precision: Q and P enter the MMAs split as bf16 hi + lo ("bf16x2", Markidis et al. 2018), per
// 16-wide k step in the fixed order Q_hi.K_hi, Q_lo.K_hi, Q_hi.K_lo (S) and P_hi.V_hi, P_lo.V_hi,
// P_hi.V_lo (O), into one f32 accumulator: ~1e-5 from the float64 reference.
// Paged (KV_PAGE = BN, attention_common.cuh): key block kb is block table[kb] of the cache (the
// batched step's prefill rows, backends/cuda_batch.py); only the addresses change.
// Napkin math (Qwen3-8B layer, T = 512 from position 0, bf16 cache): S and O are
// 2 x 2 FLOP x 32 heads x 512 x 256 keys (causal mean) x 128 = 2.1 GFLOP, x2 for the hi/lo split;
// K/V bytes ~2 MB: tensor-core bound (~4 us per layer at the H100's ~1 PFLOP/s dense bf16, of
// which mma.sync reaches a part).
// Defines: HD (64/128), GQ, KV_TYPE, PREFILL_STAGES (cuda_ops.prefill_stages).
#include "attention_kv.cuh"

#define PTHREADS 128
#define BM 64
#define BN 64
#define PTILE_ELEMS (BN * LDK)
// KV_SPLIT: K and V enter the MMAs as exact f32 split into bf16 hi + lo tiles (q8_0, fp8, f32
// caches); bf16 caches hold exact bf16 values already.
#define KV_SPLIT (KV_TYPE != KV_BF16)
#if KV_SPLIT
#define PTILES 4  // per stage: K_hi, V_hi, K_lo, V_lo
#else
#define PTILES 2  // per stage: K, V
#endif
#define PSTAGE_ELEMS (PTILES * PTILE_ELEMS)
// PREFILL_STAGES = 2: key block kb+1 fills the other stage while kb is used; 1 (cuda_ops.
// prefill_stages, where two do not fit: KV_SPLIT at HD=128 takes 136 KB with two, the 99 KB GPUs
// sm_86 / sm_89 / sm_120 allow 99): fill, barrier, use.  Same arithmetic and order: the same bits.
#ifndef PREFILL_STAGES
#define PREFILL_STAGES 2
#endif
static_assert(PREFILL_STAGES == 1 || PREFILL_STAGES == 2, "PREFILL_STAGES is 1 or 2");
#define PREFILL_SMEM (PREFILL_STAGES * PSTAGE_ELEMS * 2)  // bf16 (the wrapper computes the same)

static_assert(HD % 16 == 0, "prefill needs HD % 16 == 0");
static_assert(KV_PAGE % BN == 0, "a key block lies in one block of a paged cache");
// PREFILL_SMEM <= 227 KB for HD <= 128 (the prefill's head dims; HD=256 builds serve decode only
// with KV_SPLIT, and the wrapper refuses a launch above the limit).

// 8 f32 values -> bf16 at hi and the bf16 residuals at lo (the KV_SPLIT caches); 16-B stores.
BW24_DEVICE void store8_tile(__nv_bfloat16* hi, __nv_bfloat16* lo, const float* v) {
    uint4 h, l;
    split_bf16x2(v[0], v[1], h.x, l.x);
    split_bf16x2(v[2], v[3], h.y, l.y);
    split_bf16x2(v[4], v[5], h.z, l.z);
    split_bf16x2(v[6], v[7], h.w, l.w);
    *reinterpret_cast<uint4*>(hi) = h;
    *reinterpret_cast<uint4*>(lo) = l;
}

// Fill one stage (the K and V tiles of key block kb, plus their lo tiles with KV_SPLIT) for kv
// head h; keys >= kv_len are zero.  bf16: cp.async (committed as one group); other types:
// loaded, dequantized to exact f32 (code * scale, the reference's float32 product) and stored
// synchronously.  The caller separates this fill from the reads of the same stage by barriers.
BW24_DEVICE void prefill_load(__nv_bfloat16* stage, const uint8_t* __restrict__ ck, const uint8_t* __restrict__ cv,
                              int kb, int kv_len, int K, int h, long long scale_plane, const int* __restrict__ table) {
    __nv_bfloat16* sK = stage;
    __nv_bfloat16* sV = stage + PTILE_ELEMS;
    const long long row0 = kv_tile_row(table, kb * BN);  // the cache row of the block's first key
    for (int c = threadIdx.x; c < BN * HD / 8; c += PTHREADS) {
        const int kk = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
        const int j = kb * BN + kk;
        const bool ok = j < kv_len;
        const long long row = (ok ? row0 + kk : 0) * K + h;  // cache row (position row * K + head)
#if KV_TYPE == KV_BF16
        (void)scale_plane;
        cp_async16(sK + kk * LDK + d8, ck + (row * HD + d8) * 2, ok ? 16 : 0);
        cp_async16(sV + kk * LDK + d8, cv + (row * HD + d8) * 2, ok ? 16 : 0);
#else
        float kf[8], vf[8];
        if (ok) {
            load8(ck + (row * HD + d8) * ES, kf);
            load8(cv + (row * HD + d8) * ES, vf);
#if KV_SCALED
            const float ks = row_scale(ck + scale_plane + row * SCB, d8);
            const float vs = row_scale(cv + scale_plane + row * SCB, d8);
#pragma unroll
            for (int e = 0; e < 8; ++e) { kf[e] = __fmul_rn(kf[e], ks); vf[e] = __fmul_rn(vf[e], vs); }
#else
            (void)scale_plane;
#endif
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) kf[e] = vf[e] = 0.0f;
        }
        store8_tile(sK + kk * LDK + d8, sK + 2 * PTILE_ELEMS + kk * LDK + d8, kf);
        store8_tile(sV + kk * LDK + d8, sV + 2 * PTILE_ELEMS + kk * LDK + d8, vf);
#endif
    }
#if KV_TYPE == KV_BF16
    cp_async_commit();
#endif
}

// min 2 blocks/SM (<= 255 registers): without it ptxas capped the HD=64 q8_0/fp8 variants at
// 128 registers and spilled.  (KV_SPLIT at HD=128 needs 136 KB of shared
// memory: one block per SM.)
extern "C" __global__ void __launch_bounds__(PTHREADS, 2)
attn_prefill(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
             int T, int H, int K, int start, int n_ctx, float scale_log2, float* __restrict__ out,
             const int* __restrict__ table) {
    PDL_ENTRY();
    extern __shared__ __align__(16) uint8_t smem[];
    __nv_bfloat16* tiles = reinterpret_cast<__nv_bfloat16*>(smem);  // [stage][PTILES][BN][LDK]
    const int G = H / K, NSG = G / GQ;
    const int h = blockIdx.y / NSG, sg = blockIdx.y % NSG;
    const int bx = gridDim.x - 1 - blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    (void)tid;
    const int nrows = T * GQ;
    const int i_last = min(nrows, (bx + 1) * BM) - 1;
    const int kv_len = start + i_last / GQ + 1;  // keys any row of this block may attend
    const int nkb = (kv_len + BN - 1) / BN;
    const long long scale_plane = (long long)n_ctx * K * HD;  // q8_0/fp8: byte offset of the scale plane

    // this lane's two rows (a: lane/4, b: lane/4 + 8 within the warp's 16)
    const int ia = bx * BM + warp * 16 + (lane >> 2), ib = ia + 8;
    const bool va = ia < nrows, vb = ib < nrows;
    const int ta = va ? ia / GQ : i_last / GQ, tb = vb ? ib / GQ : i_last / GQ;
    const int pa = start + ta, pb = start + tb;
    const long long qa_off = ((long long)ta * H + h * G + sg * GQ + (va ? ia % GQ : 0)) * HD;
    const long long qb_off = ((long long)tb * H + h * G + sg * GQ + (vb ? ib % GQ : 0)) * HD;
    const int c2 = 2 * (lane & 3);

    uint32_t qf[HD / 16][4];  // Q (hi part) A fragments
    uint32_t ql[HD / 16][4];  // Q lo part
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
        const int c = kt * 16 + c2;
        const float2 a0 = va ? *reinterpret_cast<const float2*>(q + qa_off + c) : make_float2(0.f, 0.f);
        const float2 b0 = vb ? *reinterpret_cast<const float2*>(q + qb_off + c) : make_float2(0.f, 0.f);
        const float2 a1 = va ? *reinterpret_cast<const float2*>(q + qa_off + c + 8) : make_float2(0.f, 0.f);
        const float2 b1 = vb ? *reinterpret_cast<const float2*>(q + qb_off + c + 8) : make_float2(0.f, 0.f);
        split_bf16x2(a0.x, a0.y, qf[kt][0], ql[kt][0]);
        split_bf16x2(b0.x, b0.y, qf[kt][1], ql[kt][1]);
        split_bf16x2(a1.x, a1.y, qf[kt][2], ql[kt][2]);
        split_bf16x2(b1.x, b1.y, qf[kt][3], ql[kt][3]);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;

    prefill_load(tiles, cache_k, cache_v, 0, kv_len, K, h, scale_plane, table);
    for (int kb = 0; kb < nkb; ++kb) {
#if PREFILL_STAGES == 1
        const int st = 0;
        // the one stage was last read in iteration kb-1, which ended with a barrier: fill it
        if (kb > 0) prefill_load(tiles, cache_k, cache_v, kb, kv_len, K, h, scale_plane, table);
#if KV_TYPE == KV_BF16
        cp_async_wait<0>();
#endif
#else
        const int st = kb & 1;
        // Stage st^1 was last read in iteration kb-1, which ended with a barrier: refill it.
        if (kb + 1 < nkb) {
            prefill_load(tiles + (st ^ 1) * PSTAGE_ELEMS, cache_k, cache_v, kb + 1, kv_len, K, h, scale_plane, table);
#if KV_TYPE == KV_BF16
            cp_async_wait<1>();
#endif
        } else {
#if KV_TYPE == KV_BF16
            cp_async_wait<0>();
#endif
        }
#endif
        __syncthreads();  // stage st complete and visible to every warp
        const __nv_bfloat16* sK = tiles + st * PSTAGE_ELEMS;
        const __nv_bfloat16* sV = sK + PTILE_ELEMS;
#if KV_SPLIT
        const __nv_bfloat16* sKl = sK + 2 * PTILE_ELEMS;
        const __nv_bfloat16* sVl = sK + 3 * PTILE_ELEMS;
#endif

        // S = Q K^T (16 x 64 per warp); per 16-wide k step: Q_hi.K_hi, Q_lo.K_hi, Q_hi.K_lo
        float sc[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const int koff = (nt * 8 + (lane >> 2)) * LDK + c2;
#pragma unroll
            for (int kt = 0; kt < HD / 16; ++kt) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(sK + koff + kt * 16);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(sK + koff + kt * 16 + 8);
                mma_bf16(sc[nt], qf[kt], b0, b1);
                mma_bf16(sc[nt], ql[kt], b0, b1);
#if KV_SPLIT
                const uint32_t l0 = *reinterpret_cast<const uint32_t*>(sKl + koff + kt * 16);
                const uint32_t l1 = *reinterpret_cast<const uint32_t*>(sKl + koff + kt * 16 + 8);
                mma_bf16(sc[nt], qf[kt], l0, l1);
#endif
            }
        }
        // causal mask, scale, row max
        float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            const int key = kb * BN + nt * 8 + c2;
            sc[nt][0] = key <= pa ? sc[nt][0] * scale_log2 : NEG_INF;
            sc[nt][1] = key + 1 <= pa ? sc[nt][1] * scale_log2 : NEG_INF;
            sc[nt][2] = key <= pb ? sc[nt][2] * scale_log2 : NEG_INF;
            sc[nt][3] = key + 1 <= pb ? sc[nt][3] * scale_log2 : NEG_INF;
            mxa = fmaxf(mxa, fmaxf(sc[nt][0], sc[nt][1]));
            mxb = fmaxf(mxb, fmaxf(sc[nt][2], sc[nt][3]));
        }
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
        const float na = fmaxf(ma, mxa), nb2 = fmaxf(mb, mxb);  // finite: key 0 is in every row's past
        const float alpha_a = exp2f(ma - na), alpha_b = exp2f(mb - nb2);
        ma = na; mb = nb2;
        float ra = 0.0f, rb = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            sc[nt][0] = exp2f(sc[nt][0] - na);
            sc[nt][1] = exp2f(sc[nt][1] - na);
            sc[nt][2] = exp2f(sc[nt][2] - nb2);
            sc[nt][3] = exp2f(sc[nt][3] - nb2);
            ra += sc[nt][0] + sc[nt][1];
            rb += sc[nt][2] + sc[nt][3];
        }
        ra += __shfl_xor_sync(0xffffffffu, ra, 1);
        ra += __shfl_xor_sync(0xffffffffu, ra, 2);
        rb += __shfl_xor_sync(0xffffffffu, rb, 1);
        rb += __shfl_xor_sync(0xffffffffu, rb, 2);
        la = la * alpha_a + ra;
        lb = lb * alpha_b + rb;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            o[n][0] *= alpha_a; o[n][1] *= alpha_a;
            o[n][2] *= alpha_b; o[n][3] *= alpha_b;
        }
        // O += P V; per 16-key step and 8-dim tile: P_hi.V_hi, P_lo.V_hi, P_hi.V_lo
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t pa4[4], pl4[4];
            split_bf16x2(sc[2 * kk][0], sc[2 * kk][1], pa4[0], pl4[0]);
            split_bf16x2(sc[2 * kk][2], sc[2 * kk][3], pa4[1], pl4[1]);
            split_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], pa4[2], pl4[2]);
            split_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], pa4[3], pl4[3]);
            const int voff = (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDK + (lane >> 4) * 8;
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, sV + voff + dp * 16);
#if KV_SPLIT
                uint32_t bl[4];
                ldmatrix_x4_trans(bl, sVl + voff + dp * 16);
#endif
                mma_bf16(o[2 * dp], pa4, b[0], b[1]);
                mma_bf16(o[2 * dp], pl4, b[0], b[1]);
#if KV_SPLIT
                mma_bf16(o[2 * dp], pa4, bl[0], bl[1]);
#endif
                mma_bf16(o[2 * dp + 1], pa4, b[2], b[3]);
                mma_bf16(o[2 * dp + 1], pl4, b[2], b[3]);
#if KV_SPLIT
                mma_bf16(o[2 * dp + 1], pa4, bl[2], bl[3]);
#endif
            }
        }
        __syncthreads();  // every warp is done with stage st: the next iteration may refill it
    }
    const float ia_inv = 1.0f / la, ib_inv = 1.0f / lb;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        const int d = n * 8 + c2;
        if (va) *reinterpret_cast<float2*>(out + qa_off + d) = make_float2(o[n][0] * ia_inv, o[n][1] * ia_inv);
        if (vb) *reinterpret_cast<float2*>(out + qb_off + d) = make_float2(o[n][2] * ib_inv, o[n][3] * ib_inv);
    }
}
