// attention_merge.cuh — the end of a decode block, shared by attn_decode (attention_decode.cu)
// and attn_decode_tc (attention_decode_tc.cu): the block's partial softmax states merged in part
// order; then, across the splits of one (row, kv head, head group), either through the global
// workspace (the last block to arrive merges, in split order) or through distributed shared
// memory in a thread-block cluster (ATTN_CLUSTER); and the o projection's QX codes (ATTN_QX).
// Every order is fixed by L_r alone: a row's bits do not depend on m or on the other rows.
#pragma once
#include "attention_common.cuh"

#define DTHREADS 128  // attn_decode's block (attn_decode_tc: 128 per half)
// ATTN_QX (cuda_ops attn_decode qx_out): the block that finishes a (row, kv head, head group) also
// writes the integer-dot codes of its GQ * HD outputs (matvec.cu's QX layout, common.cuh
// qx_write_block; rounded to bf16 first when qx_b16) into the o projection's QX row, so the o
// matvec copies them (prologue "qx") instead of every block quantizing all H * HD inputs after
// pdl_wait.  The outputs themselves are unchanged.
#ifndef ATTN_QX
#define ATTN_QX 0
#endif

// ATTN_ROWS (attn_decode_tc; attn_decode takes 1): the rows of one block, rows r0.. of one
// sequence sharing every key tile; the block's states are [part][ATTN_ROWS * GQ] (row-major).
#ifndef ATTN_ROWS
#define ATTN_ROWS 1
#endif
#define RGQ (ATTN_ROWS * GQ)

// The block's NPART partial states of state row i (row i / GQ, head i % GQ), output dim d, merged in
// part order: (M, Ls, O).
template <int NPART>
BW24_DEVICE void merge_block_parts(const float* macc, const float* mm, const float* ml, int i, int d, float& M, float& Ls,
                                   float& O) {
    M = NEG_INF;
#pragma unroll
    for (int b = 0; b < NPART; ++b) M = fmaxf(M, mm[b * RGQ + i]);
    Ls = 0.0f;
    O = 0.0f;
#pragma unroll
    for (int b = 0; b < NPART; ++b) {
        const float mv = mm[b * RGQ + i];
        if (mv != NEG_INF) {
            const float f = exp2f(mv - M);
            Ls = fmaf(ml[b * RGQ + i], f, Ls);
            O = fmaf(macc[(b * RGQ + i) * HD + d], f, O);
        }
    }
}

// ATTN_QX: the finishing block's GQ * HD outputs (fin, a shared copy of what it stored to out) as the
// QX codes of row r's blocks hq0 * HD / 32 .. of the o projection's input (n = H * HD values):
// aligned 8-lane groups, one 32-value block each, every thread the same trip count (shuffles).
template <int NTHR>
BW24_DEVICE void attn_qx_write(const float* fin, int r, int hq0, int H, uint32_t* __restrict__ qx, int qx_b16) {
#if ATTN_QX
    __syncthreads();  // fin is complete
    const int n = H * HD, nblk = GQ * HD / 32;
    uint32_t* row = qx + (long long)r * qx_row_words(n);
    for (int i0 = 0; i0 < nblk; i0 += NTHR / 8) {
        const int i = i0 + (int)threadIdx.x / 8;
        float4 v = i < nblk ? reinterpret_cast<const float4*>(fin)[i * 8 + (threadIdx.x & 7)] : make_float4(0.f, 0.f, 0.f, 0.f);
        if (qx_b16) v = bf16_round4(v);
        qx_write_block(row, n, hq0 * HD / 32 + i, v, i < nblk);
    }
    __syncthreads();  // fin is read: the block's next row may write it
#else
    (void)fin; (void)r; (void)hq0; (void)H; (void)qx; (void)qx_b16;
#endif
}
#if ATTN_QX
#define ATTN_FIN_DECL __shared__ __align__(16) float s_fin[GQ * HD];
#define ATTN_FIN_STORE(idx, v) (s_fin[idx] = (v))
#define ATTN_FIN s_fin
#else
#define ATTN_FIN_DECL
#define ATTN_FIN_STORE(idx, v) ((void)0)
#define ATTN_FIN nullptr
#endif

// The end of a decode block, shared by attn_decode and attn_decode_tc: the block's NPART partial
// softmax states (sm_acc [NPART][RGQ][HD] un-normalised outputs, sm_m / sm_l [NPART][RGQ] maxima
// and sums, in shared memory) of each of its rows r0 + ri with keys in this split (s < nsp[ri],
// the row's split count) are merged in part order; a row of one split is finished here, else the
// (m, l, acc) of this split go to the workspace and the last block of (row, kv head, head group)
// to arrive merges the splits in split order (then resets the arrival counter).  Rows one after
// another, each exactly as a block of that row alone would.
template <int NPART, int NTHR = DTHREADS>
BW24_DEVICE void decode_finish(uint8_t* smem, const float* macc, const float* mm, const float* ml, int r0,
                               const int (&nsp)[ATTN_ROWS], int s, int hq0, int H, int K, int NSG, int max_splits,
                               int max_rows, float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt,
                               uint32_t* __restrict__ qx, int qx_b16) {
    __shared__ int s_last;
    ATTN_FIN_DECL
    const int tid = threadIdx.x;
    const int ms = max_splits;
    float* ws_ml = ws;                                         // [max_rows][H][ms][2]
    float* ws_acc = ws + (long long)max_rows * H * ms * 2;     // [max_rows][H][ms][HD]
#pragma unroll 1
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int nsplit = nsp[ri], r = r0 + ri;
        if (s >= nsplit) continue;
        for (int idx = tid; idx < GQ * HD; idx += NTHR) {
            const int g = idx / HD, d = idx % HD;
            float M, Ls, O;
            merge_block_parts<NPART>(macc, mm, ml, ri * GQ + g, d, M, Ls, O);
            const long long rh = (long long)r * H + hq0 + g;
            if (nsplit == 1) {
                out[rh * HD + d] = O / Ls;
                ATTN_FIN_STORE(idx, O / Ls);
            } else {
                ws_acc[(rh * ms + s) * HD + d] = O;
                if (d == 0) { ws_ml[(rh * ms + s) * 2] = M; ws_ml[(rh * ms + s) * 2 + 1] = Ls; }
            }
        }
        if (nsplit == 1) attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
    }

    // ---- for each row, the last block of (row, kv head, head group) merges the splits, in split order
#pragma unroll 1
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int nsplit = nsp[ri], r = r0 + ri;
        if (s >= nsplit || nsplit == 1) continue;
        __threadfence();
        __syncthreads();  // this block's parts are written (and the previous row's merge has read its smem)
        int* cnt = ws_cnt + ((long long)r * K * NSG + blockIdx.z);
        if (tid == 0) s_last = atomicAdd(cnt, 1) == nsplit - 1;
        __syncthreads();
        if (!s_last) continue;
        __threadfence();
        // This block runs last, on the critical path of every layer: loads go out together (all
        // nsplit (m, l) pairs into shared memory, then each output's partials 16 in flight) instead
        // of 2 * nsplit dependent L2 round trips.  Same operations in the same order.
        float* sml = reinterpret_cast<float*>(smem);  // [GQ][ms][2] (m, l) of every split
        float* sf = sml + GQ * ms * 2;                // [GQ][ms] split weights
        float* sL = sf + GQ * ms;                     // [GQ] softmax sums
        for (int i = tid; i < GQ * nsplit; i += NTHR) {
            const int g = i / nsplit, b = i - g * nsplit;
            const long long rh = (long long)r * H + hq0 + g;
            const float2 ml2 = __ldcg(reinterpret_cast<const float2*>(ws_ml + (rh * ms + b) * 2));
            sml[(g * ms + b) * 2] = ml2.x;
            sml[(g * ms + b) * 2 + 1] = ml2.y;
        }
        __syncthreads();
        if (tid < GQ) {
            float M = NEG_INF;
            for (int b = 0; b < nsplit; ++b) M = fmaxf(M, sml[(tid * ms + b) * 2]);
            float Ls = 0.0f;
            for (int b = 0; b < nsplit; ++b) {
                const float f = exp2f(sml[(tid * ms + b) * 2] - M);
                sf[tid * ms + b] = f;
                Ls = fmaf(sml[(tid * ms + b) * 2 + 1], f, Ls);
            }
            sL[tid] = Ls;
        }
        __syncthreads();
        for (int idx = tid; idx < GQ * HD; idx += NTHR) {
            const int g = idx / HD, d = idx % HD;
            const long long rh = (long long)r * H + hq0 + g;
            const float* part = ws_acc + rh * ms * HD + d;
            float O = 0.0f;
            for (int b0 = 0; b0 < nsplit; b0 += 16) {
                float v[16];
#pragma unroll
                for (int u = 0; u < 16; ++u) v[u] = b0 + u < nsplit ? __ldcg(part + (long long)(b0 + u) * HD) : 0.0f;
#pragma unroll
                for (int u = 0; u < 16; ++u)
                    if (b0 + u < nsplit) O = fmaf(v[u], sf[g * ms + b0 + u], O);
            }
            out[rh * HD + d] = O / sL[g];
            ATTN_FIN_STORE(idx, O / sL[g]);
        }
        attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
        if (tid == 0) *cnt = 0;  // ready for the next launch / graph replay
    }
}

#ifndef ATTN_CLUSTER  // 0 (workspace merge), or the cluster size C (cuda_ops attn_decode_cluster; see below)
#define ATTN_CLUSTER 0
#endif
#ifndef ATTN_HYBRID  // attn_decode with ATTN_CLUSTER: 0 (always the cluster), or P (decode_split_plan)
#define ATTN_HYBRID 0
#endif
#if ATTN_CLUSTER
// ATTN_CLUSTER = C (both decode kernels; sm_90+): the C split blocks of one (row, kv head, head
// group) form a thread-block cluster (grid y = max_splits = C), and the splits are merged through
// distributed shared memory instead of the global workspace: each block leaves its (m, l, O) in
// its own shared memory, a cluster barrier, the split-0 block reads every split's state (mapa +
// ld.shared::cluster) and merges them exactly as decode_finish's last block does (the same bits
// as the workspace merge with max_splits = C), a second barrier keeps the others alive until it
// has read them.  Why: the workspace merge is a chain of global fences, an arrival count and L2
// loads on the critical path; the cluster merge measured faster (docs/performance.md).  Blocks
// with s >= nsplit take part in both barriers (a cluster barrier waits for every thread of every
// block); when no row of the block has more than one split nobody waits.  Shared memory after the
// NPART parts: this split's O [RGQ][HD], (m, l) [RGQ][2], split weights [GQ][C], sums [GQ]
// (cuda_ops _decode_cluster_smem).
template <int NPART, int NTHR = DTHREADS>
BW24_DEVICE void decode_finish_cluster(uint8_t* smem, const float* macc, const float* mm, const float* ml, int r0,
                                       const int (&nsp)[ATTN_ROWS], int s, int hq0, int H, float* __restrict__ out,
                                       uint32_t* __restrict__ qx, int qx_b16) {
    const int tid = threadIdx.x;
    ATTN_FIN_DECL
    float* cpart = reinterpret_cast<float*>(smem) + NPART * RGQ * (HD + 2);  // [RGQ][HD] this split's O (after macc, mm, ml)
    float* cml = cpart + RGQ * HD;                                           // [RGQ][2] its (m, l)
    float* sf = cml + 2 * RGQ;                                               // [GQ][C] split weights (split 0's block)
    float* sL = sf + GQ * ATTN_CLUSTER;                                      // [GQ] softmax sums
    bool merge = false;  // a row of more than one split: the same in every block of the cluster
#pragma unroll 1
    for (int ri = 0; ri < ATTN_ROWS; ++ri) {
        const int nsplit = nsp[ri], r = r0 + ri;
        merge |= nsplit > 1;
        if (s >= nsplit) continue;
        for (int idx = tid; idx < GQ * HD; idx += NTHR) {
            const int g = idx / HD, d = idx % HD;
            float M, Ls, O;
            merge_block_parts<NPART>(macc, mm, ml, ri * GQ + g, d, M, Ls, O);
            if (nsplit == 1) {
                out[((long long)r * H + hq0 + g) * HD + d] = O / Ls;
                ATTN_FIN_STORE(idx, O / Ls);
            } else {
                cpart[ri * GQ * HD + idx] = O;
                if (d == 0) { cml[2 * (ri * GQ + g)] = M; cml[2 * (ri * GQ + g) + 1] = Ls; }
            }
        }
        if (nsplit == 1) attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
    }
    if (!merge) return;
    cluster_sync_all();  // every split's states are in its block's shared memory
    if (s == 0) {
#pragma unroll 1
        for (int ri = 0; ri < ATTN_ROWS; ++ri) {
            const int nsplit = nsp[ri], r = r0 + ri;
            if (nsplit <= 1) continue;
            if (tid < GQ) {  // every split's (m, l) read once, all in flight together
                const int i = ri * GQ + tid;
                float ms_[ATTN_CLUSTER], ls_[ATTN_CLUSTER];
#pragma unroll
                for (int b = 0; b < ATTN_CLUSTER; ++b) {
                    ms_[b] = b < nsplit ? ld_cluster_f32(cluster_map(cml + 2 * i, b)) : NEG_INF;
                    ls_[b] = b < nsplit ? ld_cluster_f32(cluster_map(cml + 2 * i + 1, b)) : 0.0f;
                }
                float M = NEG_INF;
#pragma unroll
                for (int b = 0; b < ATTN_CLUSTER; ++b)
                    if (b < nsplit) M = fmaxf(M, ms_[b]);
                float Ls = 0.0f;
#pragma unroll
                for (int b = 0; b < ATTN_CLUSTER; ++b)
                    if (b < nsplit) {
                        const float f = exp2f(ms_[b] - M);
                        sf[tid * ATTN_CLUSTER + b] = f;
                        Ls = fmaf(ls_[b], f, Ls);
                    }
                sL[tid] = Ls;
            }
            __syncthreads();
            for (int idx = tid; idx < GQ * HD; idx += NTHR) {
                const int g = idx / HD;
                float v[ATTN_CLUSTER];
#pragma unroll
                for (int b = 0; b < ATTN_CLUSTER; ++b)
                    v[b] = b < nsplit ? ld_cluster_f32(cluster_map(cpart + ri * GQ * HD + idx, b)) : 0.0f;
                float O = 0.0f;
#pragma unroll
                for (int b = 0; b < ATTN_CLUSTER; ++b)
                    if (b < nsplit) O = fmaf(v[b], sf[g * ATTN_CLUSTER + b], O);
                out[((long long)r * H + hq0) * HD + idx] = O / sL[g];
                ATTN_FIN_STORE(idx, O / sL[g]);
            }
            attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
            __syncthreads();  // sf and sL are read: the next row may write them
        }
    }
    cluster_sync_all();  // split 0 has read every state: the blocks may exit
}
#define ATTN_CLUSTER_DIMS __cluster_dims__(1, ATTN_CLUSTER, 1)
#else
#define ATTN_CLUSTER_DIMS
#endif

// How a row of `tiles` key tiles is split (both decode kernels).  ATTN_HYBRID = P under a
// cluster of C: a row of up to C * P tiles takes the first cluster (grid y = max_splits, a
// multiple of C) and merges in distributed shared memory; a longer row takes all max_splits
// blocks and the workspace merge (more SMs streaming its keys; the merge costs a few L2 round
// trips more).  Without ATTN_HYBRID every row takes the cluster (or, without ATTN_CLUSTER, the
// workspace).  The choice depends on L alone, so a row's bits do not depend on m.
BW24_DEVICE void decode_split_plan(int tiles, int max_splits, bool& in_cluster, int& per, int& nsplit) {
#if ATTN_CLUSTER && ATTN_HYBRID
    in_cluster = tiles <= ATTN_CLUSTER * ATTN_HYBRID;
#else
    in_cluster = ATTN_CLUSTER != 0;
#endif
    const int cap = in_cluster ? ATTN_CLUSTER : max_splits;
    per = max(1, (tiles + cap - 1) / cap);
    nsplit = (tiles + per - 1) / per;
}

// Row of L keys in tiles of tile_keys: its split count (0: no keys) and its tiles [t0, t1) in split
// s (empty when s >= nsplit).
BW24_DEVICE void decode_row_split(int L, int tile_keys, int s, int max_splits, bool& in_cluster, int& nsplit, int& t0,
                                  int& t1) {
    in_cluster = ATTN_CLUSTER != 0;
    nsplit = t0 = t1 = 0;
    if (L <= 0) return;
    const int tiles = (L + tile_keys - 1) / tile_keys;
    int per;
    decode_split_plan(tiles, max_splits, in_cluster, per, nsplit);
    if (s < nsplit) {
        t0 = s * per;
        t1 = min(tiles, t0 + per);
    }
}

// A block with no keys of its rows (s >= nsplit of each; nsplit: the most of its rows): inside a
// merging cluster it still takes part in decode_finish_cluster's two barriers (a cluster barrier
// waits for every thread of every block); blocks of the other clusters just leave.
BW24_DEVICE void decode_idle_split(bool in_cluster, int nsplit, int s) {
#if ATTN_CLUSTER
    if (in_cluster && nsplit > 1 && s < ATTN_CLUSTER) { cluster_sync_all(); cluster_sync_all(); }
#else
    (void)in_cluster; (void)nsplit; (void)s;
#endif
}
