// attention_decode_tc.cu — split-K decode attention on tensor cores (mma.sync m16n8k16 bf16)
// for m = 1..8 query rows over a bf16 cache, head dims 32..128 (other caches: attention_decode.cu).
//
// Contract: attention_decode.cu's (the split rule with TK = TCK, the workspace or cluster merge of
// attention_merge.cuh, rows bit-equal for any m and any other rows).  NumPy reference:
// kernel_refs.attention_ref (max rel. error <= 2e-3; this kernel ~1e-5); GPU test:
// tests/gpu/test_attention.py.  Grid (ceil(m / ATTN_ROWS), max_splits, K*NSG); n_rows = m.
// Math (as the precise prefill): per block ATTN_ROWS rows r0.. (one sequence: they read the same
// cache; cuda_ops.attn_decode_rows), one kv head, GQ query heads: MMA row i = (row i / GQ, head i %
// GQ), i < ATTN_ROWS * GQ <= 16 (the other rows zero), so each key tile is fetched and multiplied
// once for all the rows.  Q (f32) enters as bf16 hi + lo (x = hi + lo to 2^-17), K and V are exact
// bf16; S = Q_hi.K + Q_lo.K, masked to the row's own keys in this split ([t0, t1) tiles of its
// split plan, keys < L_r), scaled to the log2 domain; online softmax per warp and MMA row; P =
// exp2(S - m) split the same way, O += P_hi.V + P_lo.V.  An MMA row's results do not depend on
// the other rows, a tile outside a row's keys leaves its state as it is (p = 0, alpha = 1), and a
// tile always meets the same warp: so a row's bits are those of its block alone.
// Geometry: 128 threads = 4 warps per half, TC_HALVES = 1 or 2 halves (cuda_ops.decode_tc_config:
// 2 where a 4-tile ring fits, 227 KB GPUs).  A block tile is TCK = 64 keys of K and V (rows padded
// to LDK bf16), a TCSTAGES-deep cp.async ring over the union of the rows' tiles; warp w owns keys
// 16w..16w+15 of every tile of its half, with its own (m, l, O) per MMA row.  Half hf computes the
// tiles t with t % TC_HALVES == hf: two tiles' MMA / softmax chains run side by side (one 4-warp
// block per SM leaves one warp per scheduler: the per-tile chain latency, not the bytes, bounds
// the kernel).  The warps are merged in warp order by attention_merge.cuh, row after row.  Under
// PDL the first tiles are fetched before pdl_wait, except the keys >= min L_r - max_rows that this
// step's cache write may have produced (fetched after it).
// Paged (KV_PAGE, attention_common.cuh): the block's block table is tables + r0 * table_stride
// (one row per block: the batched pass's rows are different sequences); a 64-key tile is one
// block's consecutive rows, so only the addresses change.
// Napkin math (Qwen3-8B, hd 128, 8 kv heads, 8192 keys): K+V = 2 x 8192 x 8 x 256 B = 33.6 MB
// per layer and row at ~2 FLOP per byte: HBM-bound, 10 us per layer at the H100's 3.35 TB/s; the
// FMA kernel is instruction-bound at ~1.4 TB/s, this one issues ~600 warp-instructions per 64-key
// tile and block (+ ~40 for the softmax of MMA rows 8..15 past 2 rows x 4 heads).  A verify of
// 4 rows reads the bytes and issues the MMAs of one row.
#include "attention_merge.cuh"

#define TCK 64
#ifndef TC_HALVES  // 1 or 2 four-warp halves per block (cuda_ops.decode_tc_config)
#define TC_HALVES 1
#endif
#ifndef TCSTAGES  // pipeline depth in tiles (cuda_ops.decode_tc_config)
#define TCSTAGES (TC_HALVES == 2 ? 4 : 3)
#endif
#define TC_THREADS (128 * TC_HALVES)
#define TC_RING (TCSTAGES / TC_HALVES)  // steps of TC_HALVES tiles in the ring
static_assert(TC_HALVES == 1 || TC_HALVES == 2, "TC_HALVES is 1 or 2");
static_assert(TCSTAGES % TC_HALVES == 0 && TC_RING >= 2, "TCSTAGES: a multiple of TC_HALVES, at least two steps");
#define TC_STAGE_ELEMS (2 * TCK * LDK)
#define DECODE_TC_SMEM (TCSTAGES * TC_STAGE_ELEMS * 2)  // the wrapper computes the same number
#if ATTN_CLUSTER
static_assert((4 * TC_HALVES * RGQ * (HD + 2) + RGQ * HD + 2 * RGQ + GQ * ATTN_CLUSTER + GQ) * 4 <= DECODE_TC_SMEM,
              "decode_finish_cluster's shared memory (parts, this split's state, split weights) fits the pipeline's");
#endif

static_assert(HD <= 128 && HD % 16 == 0, "attn_decode_tc: head dims 32..128");
static_assert(KV_PAGE % TCK == 0, "a key tile lies in one block of a paged cache");
static_assert(TC_THREADS % (HD / 8) == 0 && (TCK * (HD / 8)) % TC_THREADS == 0,
              "a tile's chunks are a whole number of the block's, each thread's KSTEP keys apart");
static_assert(RGQ <= 16, "a block's (row, head) pairs fill at most the 16 MMA rows");
static_assert(ATTN_HYBRID == 0, "attn_decode_tc: every row of a block takes the same merge");
static_assert((4 * TC_HALVES * RGQ * (HD + 2)) * 4 <= DECODE_TC_SMEM, "the warps' states fit the pipeline's shared memory");
#define TC_HI (RGQ > 8)  // MMA rows 8..15 carry (row, head) pairs too
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2 / TC_HALVES) ATTN_CLUSTER_DIMS
attn_decode_tc(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
               const int* __restrict__ lengths, int H, int K, int n_ctx, int max_splits, int max_rows, float scale_log2,
               float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt, uint32_t* __restrict__ qx, int qx_b16,
               const int* __restrict__ tables, int table_stride, int n_rows) {
    pdl_trigger();
    extern __shared__ __align__(16) uint8_t smem[];
    __nv_bfloat16* tiles = reinterpret_cast<__nv_bfloat16*>(smem);  // [stage][K, V][TCK][LDK]
    (void)n_ctx;
    const int r0 = blockIdx.x * ATTN_ROWS, s = blockIdx.y;
    // The block's rows (lengths are written before the step's first kernel: readable before
    // pdl_wait): each row's split count, the union [T0, T1) of their tiles in this split, the
    // shortest and longest row with keys here.
    int nsp[ATTN_ROWS];
    int T0 = 0x7fffffff, T1 = 0, Lmin = 0x7fffffff, Lmax = 0, most = 0;
    bool in_cluster = ATTN_CLUSTER != 0;
#pragma unroll
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int L = r0 + ri < n_rows ? lengths[r0 + ri] : 0;
        int t0, t1;
        decode_row_split(L, TCK, s, max_splits, in_cluster, nsp[ri], t0, t1);
        most = max(most, nsp[ri]);
        if (t1 > t0) { T0 = min(T0, t0); T1 = max(T1, t1); Lmin = min(Lmin, L); Lmax = max(Lmax, L); }
    }
    if (T1 <= T0) {
        pdl_wait();
        decode_idle_split(in_cluster, most, s);
        return;
    }
    const int G = H / K, NSG = G / GQ;
    const int h = blockIdx.z / NSG, sg = blockIdx.z % NSG;
    const int hq0 = h * G + sg * GQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hf = warp >> 2;  // this warp's half (TC_HALVES == 2): it computes the tiles t with t % 2 == hf
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    // this lane's MMA rows i = g and g + 8: (row i / GQ, head i % GQ), keys [lo, hi) of that row here
    int lo[2], hi[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int i = g + 8 * u, ri = i / GQ;
        const int L = i < RGQ && r0 + ri < n_rows ? lengths[r0 + ri] : 0;
        bool ic;
        int ns, t0, t1;
        decode_row_split(L, TCK, s, max_splits, ic, ns, t0, t1);
        lo[u] = t0 * TCK;
        hi[u] = min(L, t1 * TCK);
    }
    // steps of TC_HALVES tiles from an even tile: tile t is always computed by half t % TC_HALVES, so
    // a row's tiles meet the same warps in the same order whatever the block's other rows
    const int B = T0 - T0 % TC_HALVES;
    const int nstep = (T1 - B + TC_HALVES - 1) / TC_HALVES;

    // Keys >= fresh may have been written by the previous kernel (this step's rope / cache write:
    // the newest m <= max_rows positions); older keys were written by earlier steps.  So the first
    // stages are fetched before pdl_wait without the fresh keys (their memory latency overlaps the
    // previous kernel), and the fresh keys of those stages after it.  Keys >= Lmax are zero-filled
    // (V rows meet p = 0: they must be finite).  mode 0: before the wait (keys < fresh, zeros for
    // keys >= Lmax, nothing in between); 1: the fresh keys only; 2: every key < Lmax, zeros after.
    const int fresh = Lmin - max_rows;
    // this thread's 16-byte chunks of a tile: dims d8.. of keys kk0 + KSTEP * i, unrolled, their
    // cache addresses from one per tile (a loop whose trip count depends on tid recomputed each
    // chunk's 64-bit address: ~25 instructions per K / V pair, issued before the step's MMAs)
    constexpr int CPR = HD / 8, KSTEP = TC_THREADS / CPR;
    const int kk0 = tid / CPR, d8 = (tid % CPR) * 8;
    const long long key_bytes = (long long)K * HD * 2;  // one key of the cache (every head)
    const uint8_t* gk0 = cache_k + ((long long)h * HD + d8) * 2;  // key 0's chunk: also the zero-fill's address
    const uint8_t* gv0 = cache_v + ((long long)h * HD + d8) * 2;
    const int* table = tables + (long long)r0 * table_stride;  // KV_PAGE only (the block's rows: one sequence)
    auto issue = [&](int tile, int st, int mode) {
        __nv_bfloat16* sK = tiles + st * TC_STAGE_ELEMS;
        __nv_bfloat16* sV = sK + TCK * LDK;
        const int key0 = tile * TCK;
        const long long row = kv_tile_row(table, key0) + kk0;  // the cache row of key key0 + kk0
        const uint8_t* gk = gk0 + row * key_bytes;
        const uint8_t* gv = gv0 + row * key_bytes;
#pragma unroll
        for (int i = 0; i < TCK / KSTEP; ++i) {
            const int kk = kk0 + KSTEP * i, j = key0 + kk;
            const bool ok = j < Lmax;
            if ((mode == 0 && ok && j >= fresh) || (mode == 1 && (!ok || j < fresh))) continue;
            const long long off = i * KSTEP * key_bytes;
            cp_async16(sK + kk * LDK + d8, ok ? gk + off : gk0, ok ? 16 : 0);
            cp_async16(sV + kk * LDK + d8, ok ? gv + off : gv0, ok ? 16 : 0);
        }
    };
    // step j's tiles: B + j * TC_HALVES + hh in stages (j % TC_RING) * TC_HALVES + hh
    auto issue_step = [&](int j, int mode) {
#pragma unroll
        for (int hh = 0; hh < TC_HALVES; ++hh) {
            const int t = B + j * TC_HALVES + hh;
            if (t >= T0 && t < T1 && (mode != 1 || (t + 1) * TCK > fresh)) issue(t, (j % TC_RING) * TC_HALVES + hh, mode);
        }
    };
#pragma unroll
    for (int j = 0; j < TC_RING - 1; ++j) {
        issue_step(j, 0);
        cp_async_commit();
    }
    pdl_wait();  // q and the fresh keys come from the previous kernel
    // the fresh keys of the prefetched stages (one more group; the first wait below drains all)
    const bool refill = min(T1, B + (TC_RING - 1) * TC_HALVES) * TCK > fresh;
    if (refill) {
#pragma unroll
        for (int j = 0; j < TC_RING - 1; ++j) issue_step(j, 1);
        cp_async_commit();
    }

    // Q as A fragments, hi and lo parts: rows g (q[0]) and g + 8 (q[1]; zero without TC_HI)
    uint32_t qh[2][HD / 16][2], ql[2][HD / 16][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int i = g + 8 * u, ri = i / GQ;
        const bool valid = (u == 0 || TC_HI) && i < RGQ && r0 + ri < n_rows;
        const float* qrow = q + ((long long)(r0 + (valid ? ri : 0)) * H + hq0 + (valid ? i % GQ : 0)) * HD;
#pragma unroll
        for (int kt = 0; kt < HD / 16; ++kt) {
            const float2 a0 = valid ? *reinterpret_cast<const float2*>(qrow + kt * 16 + c2) : make_float2(0.f, 0.f);
            const float2 a1 = valid ? *reinterpret_cast<const float2*>(qrow + kt * 16 + c2 + 8) : make_float2(0.f, 0.f);
            split_bf16x2(a0.x, a0.y, qh[u][kt][0], ql[u][kt][0]);
            split_bf16x2(a1.x, a1.y, qh[u][kt][1], ql[u][kt][1]);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_[2] = {NEG_INF, NEG_INF}, l_[2] = {0.0f, 0.0f};  // rows g, g + 8
    const int kw = (warp & 3) * 16;  // this warp's keys within a tile

    for (int j = 0; j < nstep; ++j) {
        if (j == 0 && refill)
            cp_async_wait<0>();
        else
            cp_async_wait<TC_RING - 2>();
        __syncthreads();  // step j's tiles visible to all; everyone is done with step j-1's stages
        if (j + TC_RING - 1 < nstep) issue_step(j + TC_RING - 1, 2);
        cp_async_commit();
        const int t = B + j * TC_HALVES + hf;  // this half's tile
        if (t < T0 || t >= T1) continue;       // not a tile of the block's rows in this split
        const __nv_bfloat16* sK = tiles + ((j % TC_RING) * TC_HALVES + hf) * TC_STAGE_ELEMS;
        const __nv_bfloat16* sV = sK + TCK * LDK;
        const int key0 = t * TCK + kw;

        // S (rows g, g + 8; keys kw + 8nt + c2, +1) = (Q_hi.K over even k steps + Q_hi.K over odd
        // ones) + (the same for Q_lo): four independent accumulator chains per 8 keys, interleaved
        // over both 8-key groups, so the MMA latency (~30 cycles) overlaps instead of adding up
        // along one chain of 2*HD/16.  An MMA row's results do not depend on the other rows.
        float sc[2][4];
        {
            float ch[2][4][4];  // [nt][Q_hi even, Q_hi odd, Q_lo even, Q_lo odd]
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) ch[nt][c][0] = ch[nt][c][1] = ch[nt][c][2] = ch[nt][c][3] = 0.0f;
#pragma unroll
            for (int kt = 0; kt < HD / 16; ++kt) {
                const uint32_t ah[4] = {qh[0][kt][0], TC_HI ? qh[1][kt][0] : 0u, qh[0][kt][1], TC_HI ? qh[1][kt][1] : 0u};
                const uint32_t al[4] = {ql[0][kt][0], TC_HI ? ql[1][kt][0] : 0u, ql[0][kt][1], TC_HI ? ql[1][kt][1] : 0u};
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    const int koff = (kw + nt * 8 + g) * LDK + c2 + kt * 16;
                    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(sK + koff);
                    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(sK + koff + 8);
                    mma_bf16(ch[nt][kt & 1], ah, b0, b1);
                    mma_bf16(ch[nt][2 + (kt & 1)], al, b0, b1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    sc[nt][e] = __fadd_rn(__fadd_rn(ch[nt][0][e], ch[nt][1][e]), __fadd_rn(ch[nt][2][e], ch[nt][3][e]));
        }
        // online softmax of row g (accumulator elements 0, 1) and row g + 8 (2, 3), each over its
        // own keys; the scale is an explicit rounded product, so no build contracts it differently
#pragma unroll
        for (int u = 0; u < 1 + TC_HI; ++u) {
            const int e0 = 2 * u;
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const int key = key0 + nt * 8 + c2;
                sc[nt][e0] = key >= lo[u] && key < hi[u] ? __fmul_rn(sc[nt][e0], scale_log2) : NEG_INF;
                sc[nt][e0 + 1] = key + 1 >= lo[u] && key + 1 < hi[u] ? __fmul_rn(sc[nt][e0 + 1], scale_log2) : NEG_INF;
                mx = fmaxf(mx, fmaxf(sc[nt][e0], sc[nt][e0 + 1]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m_[u], mx);
            const float base = mn == NEG_INF ? 0.0f : mn;  // no valid key yet: p = 0, state unchanged
            const float alpha = exp2f(m_[u] - base);
            m_[u] = mn;
            float rs = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                sc[nt][e0] = exp2f(sc[nt][e0] - base);
                sc[nt][e0 + 1] = exp2f(sc[nt][e0 + 1] - base);
                rs += sc[nt][e0] + sc[nt][e0 + 1];
            }
            rs += __shfl_xor_sync(0xffffffffu, rs, 1);
            rs += __shfl_xor_sync(0xffffffffu, rs, 2);
            l_[u] = __fmaf_rn(l_[u], alpha, rs);
#pragma unroll
            for (int n = 0; n < HD / 8; ++n) { o[n][e0] *= alpha; o[n][e0 + 1] *= alpha; }
        }

        // O += P_hi.V + P_lo.V over the warp's 16 keys (one k step), 8 dims per MMA
        uint32_t ph[4], pl[4];
        split_bf16x2(sc[0][0], sc[0][1], ph[0], pl[0]);
        split_bf16x2(sc[1][0], sc[1][1], ph[2], pl[2]);
        if (TC_HI) {
            split_bf16x2(sc[0][2], sc[0][3], ph[1], pl[1]);
            split_bf16x2(sc[1][2], sc[1][3], ph[3], pl[3]);
        } else {
            ph[1] = ph[3] = pl[1] = pl[3] = 0u;
        }
        const int voff = (kw + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDK + (lane >> 4) * 8;
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp += 2) {  // two 16-dim groups: 4 chains between dependent MMAs
            uint32_t b[2][4];
            ldmatrix_x4_trans(b[0], sV + voff + dp * 16);
            ldmatrix_x4_trans(b[1], sV + voff + dp * 16 + 16);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                mma_bf16(o[2 * (dp + u)], ph, b[u][0], b[u][1]);
                mma_bf16(o[2 * (dp + u) + 1], ph, b[u][2], b[u][3]);
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                mma_bf16(o[2 * (dp + u)], pl, b[u][0], b[u][1]);
                mma_bf16(o[2 * (dp + u) + 1], pl, b[u][2], b[u][3]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline buffers are reused for the merge

    // the 4 * TC_HALVES warps' states -> shared memory, then decode_finish merges them in warp order
    float* macc = reinterpret_cast<float*>(smem);  // [4 * TC_HALVES][RGQ][HD]
    float* mm = macc + 4 * TC_HALVES * RGQ * HD;    // [4 * TC_HALVES][RGQ]
    float* ml = mm + 4 * TC_HALVES * RGQ;
#pragma unroll
    for (int u = 0; u < 1 + TC_HI; ++u) {
        const int i = g + 8 * u;
        if (i >= RGQ) continue;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n)
            *reinterpret_cast<float2*>(macc + (warp * RGQ + i) * HD + n * 8 + c2) = make_float2(o[n][2 * u], o[n][2 * u + 1]);
        if (c2 == 0) { mm[warp * RGQ + i] = m_[u]; ml[warp * RGQ + i] = l_[u]; }
    }
    __syncthreads();
#if ATTN_CLUSTER
    if (in_cluster) {
        decode_finish_cluster<4 * TC_HALVES, TC_THREADS>(smem, macc, mm, ml, r0, nsp, s, hq0, H, out, qx, qx_b16);
        return;
    }
#endif
    decode_finish<4 * TC_HALVES, TC_THREADS>(smem, macc, mm, ml, r0, nsp, s, hq0, H, K, NSG, max_splits, max_rows, out,
                                             ws, ws_cnt, qx, qx_b16);
}
