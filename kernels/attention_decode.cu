// attention_decode.cu — split-K decode attention (flash-decoding) on FMAs for m = 1..8 query
// rows over a q8_0 / fp8 / f32 cache (bf16 caches take attention_decode_tc.cu).
//
// Contract: row r attends keys 0..L_r-1, L_r = lengths[r] (device int32, so a CUDA graph replays
// with new lengths); out[r, h] = softmax(q[r, h] . K^T * scale) V over the dequantized cache
// (attention_kv.cuh).  NumPy references: kernel_refs.attention_ref (float64, max rel. error
// <= 2e-3) and decode_splits (the split rule); GPU test: tests/gpu/test_attention.py.
// Split rule (depends only on L_r and the static max_splits, never on m): tiles = ceil(L/TK),
// per = ceil(tiles/max_splits), n_split = ceil(tiles/per); split s covers tiles
// [s*per, min(tiles, (s+1)*per)) (attention_merge.cuh decode_split_plan: with a cluster, C
// splits up to C * ATTN_HYBRID tiles).  Grid (m, max_splits, K*NSG), 128 threads; blocks with
// s >= n_split(L_r) exit at once, so the grid never depends on lengths (graph-safe).  The row
// index is the fastest grid dimension so the m rows of one split share the K/V tile through L2.
// A block: one row, one kv head, GQ query heads, one split.  K/V tiles of TK=32 keys stream
// through a 3-stage cp.async pipeline.  A "sub-warp" of LPK = HD/8 lanes owns one key at a time
// (8 dims per lane, GQ partial dots reduced by an xor butterfly); the block's 4*32/LPK sub-warps
// take keys sid, sid+NSUB, ... of each tile, each with its own online softmax (m, l, acc[GQ][8]),
// merged at the end in sub-warp order (attention_merge.cuh).
// Paged (KV_PAGE, attention_common.cuh): row r's block table is tables + r * table_stride; a
// tile's keys are one block's consecutive rows, so only the addresses change.
// Napkin math (Qwen3-8B, hd 128, 8 kv heads, 8192 keys, q8_0): K+V = 2 x 8192 x 8 x (128 + 8) B
// = 17.8 MB per layer and row; ~2 FLOP per byte.  The roofline is HBM bandwidth (3.35 TB/s on an
// H100: 5.3 us per layer), but this kernel is bound by instruction issue (~100 warp-instructions
// per key and head group): that is why bf16 caches take the tensor-core kernel.
#include "attention_kv.cuh"
#include "attention_merge.cuh"

#define TK 32
#define STAGES 3
#define LPK (HD / 8)           // lanes per key
#define KPW (32 / LPK)         // keys per warp step
#define NSUB (4 * KPW)         // sub-warps per block
#define KPS (TK / NSUB)        // keys per sub-warp per tile
#define STAGE_BYTES (2 * TK * ROWB + 2 * TK * SCB)

static_assert(LPK >= 1 && LPK <= 32 && (32 % LPK) == 0, "HD/8 must divide 32");
static_assert(TK % NSUB == 0, "tile must split evenly over sub-warps");
static_assert(KV_PAGE % TK == 0, "a key tile lies in one block of a paged cache");
static_assert(ATTN_ROWS == 1, "attn_decode: one row per block");

// Dynamic shared memory the decode kernel needs (cuda_ops._decode_smem computes the same number).
#define DECODE_MERGE_BYTES (NSUB * GQ * (HD + 2) * 4)
#define DECODE_SMEM (STAGES * STAGE_BYTES > DECODE_MERGE_BYTES ? STAGES * STAGE_BYTES : DECODE_MERGE_BYTES)

extern "C" __global__ void __launch_bounds__(DTHREADS) ATTN_CLUSTER_DIMS
attn_decode(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
            const int* __restrict__ lengths, int H, int K, int n_ctx, int max_splits, int max_rows, float scale_log2,
            float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt, uint32_t* __restrict__ qx, int qx_b16,
            const int* __restrict__ tables, int table_stride, int n_rows) {
    (void)n_rows;  // the grid's rows (attn_decode_tc's block rows: one here)
    PDL_ENTRY();
    extern __shared__ __align__(16) uint8_t smem[];
    const int r = blockIdx.x, s = blockIdx.y;
    const int L = lengths[r];
    if (L <= 0) return;
    const int tiles = (L + TK - 1) / TK;
    bool in_cluster;
    int per, nsplit;
    decode_split_plan(tiles, max_splits, in_cluster, per, nsplit);
    if (s >= nsplit) {
        decode_idle_split(in_cluster, nsplit, s);
        return;
    }
    const int t0 = s * per, ntile = min(tiles, t0 + per) - t0;

    const int G = H / K, NSG = G / GQ;
    const int h = blockIdx.z / NSG, sg = blockIdx.z % NSG;
    const int hq0 = h * G + sg * GQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sl = lane % LPK, sid = warp * KPW + lane / LPK;
    const long long scale_plane = (long long)n_ctx * K * HD;  // byte offset of the scale plane
    (void)scale_plane;
    const int* table = tables + (long long)r * table_stride;  // KV_PAGE only

    float qr[GQ][8];
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        const float4* qp = reinterpret_cast<const float4*>(q + ((long long)r * H + hq0 + g) * HD + sl * 8);
        const float4 a = qp[0], b = qp[1];
        qr[g][0] = a.x; qr[g][1] = a.y; qr[g][2] = a.z; qr[g][3] = a.w;
        qr[g][4] = b.x; qr[g][5] = b.y; qr[g][6] = b.z; qr[g][7] = b.w;
    }
    float m_[GQ], l_[GQ], acc[GQ][8];
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        m_[g] = NEG_INF; l_[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
    }

    auto issue = [&](int tile, int st) {
        uint8_t* base = smem + st * STAGE_BYTES;
        const int key0 = tile * TK;
        const long long row0 = kv_tile_row(table, key0);  // the cache row of key0
        for (int c = tid; c < TK * ROWB / 16; c += DTHREADS) {
            const int kk = c / (ROWB / 16), off = (c % (ROWB / 16)) * 16;
            const int j = key0 + kk;
            const bool ok = j < L;
            const long long g = ((ok ? row0 + kk : 0) * K + h) * ROWB + off;
            cp_async16(base + kk * ROWB + off, cache_k + g, ok ? 16 : 0);
            cp_async16(base + TK * ROWB + kk * ROWB + off, cache_v + g, ok ? 16 : 0);
        }
#if SCB > 0
        for (int c = tid; c < TK * SCB / 4; c += DTHREADS) {
            const int kk = c / (SCB / 4), off = (c % (SCB / 4)) * 4;
            const int j = key0 + kk;
            const bool ok = j < L;
            const long long g = scale_plane + ((ok ? row0 + kk : 0) * K + h) * SCB + off;
            cp_async4(base + 2 * TK * ROWB + kk * SCB + off, cache_k + g, ok ? 4 : 0);
            cp_async4(base + 2 * TK * ROWB + TK * SCB + kk * SCB + off, cache_v + g, ok ? 4 : 0);
        }
#endif
    };

#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < ntile) issue(t0 + i, i);
        cp_async_commit();
    }
    for (int it = 0; it < ntile; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile `it` visible to all; everyone is done with tile it-1's stage
        if (it + STAGES - 1 < ntile) issue(t0 + it + STAGES - 1, (it + STAGES - 1) % STAGES);
        cp_async_commit();

        const uint8_t* base = smem + (it % STAGES) * STAGE_BYTES;
        const uint8_t* sK = base;
        const uint8_t* sV = base + TK * ROWB;
        const uint8_t* sKs = base + 2 * TK * ROWB;
        const uint8_t* sVs = sKs + TK * SCB;
        const int key0 = (t0 + it) * TK;
        float p[KPS][GQ];
#pragma unroll
        for (int kk = 0; kk < KPS; ++kk) {
            const int jl = sid + NSUB * kk;
            float kf[8];
            load8(sK + jl * ROWB + sl * 8 * ES, kf);
            const float ksc = row_scale(sKs + jl * SCB, sl * 8);
            (void)ksc;
#pragma unroll
            for (int g = 0; g < GQ; ++g) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(qr[g][e], kf[e], d);
#if KV_SCALED
                d *= ksc;
#endif
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                p[kk][g] = key0 + jl < L ? d * scale_log2 : NEG_INF;
            }
        }
#pragma unroll
        for (int g = 0; g < GQ; ++g) {
            float mx = m_[g];
#pragma unroll
            for (int kk = 0; kk < KPS; ++kk) mx = fmaxf(mx, p[kk][g]);
            if (mx == NEG_INF) {  // nothing valid seen yet by this sub-warp
#pragma unroll
                for (int kk = 0; kk < KPS; ++kk) p[kk][g] = 0.0f;
                continue;
            }
            const float alpha = exp2f(m_[g] - mx);
            m_[g] = mx;
            l_[g] *= alpha;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
#pragma unroll
            for (int kk = 0; kk < KPS; ++kk) {
                p[kk][g] = exp2f(p[kk][g] - mx);
                l_[g] += p[kk][g];
            }
        }
#pragma unroll
        for (int kk = 0; kk < KPS; ++kk) {
            const int jl = sid + NSUB * kk;
            float vf[8];
            load8(sV + jl * ROWB + sl * 8 * ES, vf);
            const float vsc = row_scale(sVs + jl * SCB, sl * 8);
            (void)vsc;
#pragma unroll
            for (int g = 0; g < GQ; ++g) {
#if KV_SCALED
                const float pv = p[kk][g] * vsc;
#else
                const float pv = p[kk][g];
#endif
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pv, vf[e], acc[g][e]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline buffers are reused for the merge

    // ---- merge the sub-warps of this block, in sub-warp order
    float* macc = reinterpret_cast<float*>(smem);  // [NSUB][GQ][HD]
    float* mm = macc + NSUB * GQ * HD;              // [NSUB][GQ]
    float* ml = mm + NSUB * GQ;
#pragma unroll
    for (int g = 0; g < GQ; ++g) {
        float4* dst = reinterpret_cast<float4*>(macc + (sid * GQ + g) * HD + sl * 8);
        dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        if (sl == 0) { mm[sid * GQ + g] = m_[g]; ml[sid * GQ + g] = l_[g]; }
    }
    __syncthreads();
    const int nsp[1] = {nsplit};
#if ATTN_CLUSTER
    if (in_cluster) {
        decode_finish_cluster<NSUB>(smem, macc, mm, ml, r, nsp, s, hq0, H, out, qx, qx_b16);
        return;
    }
#endif
    decode_finish<NSUB>(smem, macc, mm, ml, r, nsp, s, hq0, H, K, NSG, max_splits, max_rows, out, ws, ws_cnt, qx, qx_b16);
}
