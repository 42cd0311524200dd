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

// The block's NPART partial states of head g, output dim d, merged in part order: (M, Ls, O).
template <int NPART>
BW24_DEVICE void merge_block_parts(const float* macc, const float* mm, const float* ml, int g, int d, float& M, float& Ls,
                                   float& O) {
    M = NEG_INF;
#pragma unroll
    for (int b = 0; b < NPART; ++b) M = fmaxf(M, mm[b * GQ + g]);
    Ls = 0.0f;
    O = 0.0f;
#pragma unroll
    for (int b = 0; b < NPART; ++b) {
        const float mv = mm[b * GQ + g];
        if (mv != NEG_INF) {
            const float f = exp2f(mv - M);
            Ls = fmaf(ml[b * GQ + g], f, Ls);
            O = fmaf(macc[(b * GQ + g) * HD + d], f, O);
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
// softmax states (sm_acc [NPART][GQ][HD] un-normalised outputs, sm_m / sm_l [NPART][GQ] maxima and
// sums, in shared memory) are merged in part order; with one split the row is finished here, else
// the (m, l, acc) of this split go to the workspace and the last block of (row, kv head, head
// group) to arrive merges the splits in split order (then resets the arrival counter).
template <int NPART, int NTHR = DTHREADS>
BW24_DEVICE void decode_finish(uint8_t* smem, const float* macc, const float* mm, const float* ml, int r, int s,
                               int nsplit, int hq0, int H, int K, int NSG, int max_splits, int max_rows,
                               float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt,
                               uint32_t* __restrict__ qx, int qx_b16) {
    __shared__ int s_last;
    ATTN_FIN_DECL
    const int tid = threadIdx.x;
    const int ms = max_splits;
    float* ws_ml = ws;                                         // [max_rows][H][ms][2]
    float* ws_acc = ws + (long long)max_rows * H * ms * 2;     // [max_rows][H][ms][HD]
    for (int idx = tid; idx < GQ * HD; idx += NTHR) {
        const int g = idx / HD, d = idx % HD;
        float M, Ls, O;
        merge_block_parts<NPART>(macc, mm, ml, g, d, M, Ls, O);
        const long long rh = (long long)r * H + hq0 + g;
        if (nsplit == 1) {
            out[rh * HD + d] = O / Ls;
            ATTN_FIN_STORE(idx, O / Ls);
        } else {
            ws_acc[(rh * ms + s) * HD + d] = O;
            if (d == 0) { ws_ml[(rh * ms + s) * 2] = M; ws_ml[(rh * ms + s) * 2 + 1] = Ls; }
        }
    }
    if (nsplit == 1) {
        attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
        return;
    }

    // ---- last block of (row, kv head, head group) merges the splits, in split order
    __threadfence();
    __syncthreads();
    int* cnt = ws_cnt + ((long long)r * K * NSG + blockIdx.z);
    if (tid == 0) s_last = atomicAdd(cnt, 1) == nsplit - 1;
    __syncthreads();
    if (!s_last) return;
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
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(ws_ml + (rh * ms + b) * 2));
        sml[(g * ms + b) * 2] = ml.x;
        sml[(g * ms + b) * 2 + 1] = ml.y;
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
// block); with nsplit == 1 nobody waits.  Shared memory after the NPART parts: this split's O
// [GQ][HD], (m, l) [GQ][2], split weights [GQ][C], sums [GQ] (cuda_ops _decode_smem /
// _decode_tc_smem).
template <int NPART, int NTHR = DTHREADS>
BW24_DEVICE void decode_finish_cluster(uint8_t* smem, const float* macc, const float* mm, const float* ml, int r, int s,
                                       int nsplit, int hq0, int H, float* __restrict__ out, uint32_t* __restrict__ qx,
                                       int qx_b16) {
    const int tid = threadIdx.x;
    ATTN_FIN_DECL
    float* cpart = reinterpret_cast<float*>(smem) + NPART * GQ * (HD + 2);  // [GQ][HD] this split's O (after macc, mm, ml)
    float* cml = cpart + GQ * HD;                                           // [GQ][2] its (m, l)
    float* sf = cml + 2 * GQ;                                               // [GQ][C] split weights (split 0's block)
    float* sL = sf + GQ * ATTN_CLUSTER;                                     // [GQ] softmax sums
    for (int idx = tid; idx < GQ * HD; idx += NTHR) {
        const int g = idx / HD, d = idx % HD;
        float M, Ls, O;
        merge_block_parts<NPART>(macc, mm, ml, g, d, M, Ls, O);
        if (nsplit == 1) {
            out[((long long)r * H + hq0 + g) * HD + d] = O / Ls;
            ATTN_FIN_STORE(idx, O / Ls);
        } else {
            cpart[idx] = O;
            if (d == 0) { cml[2 * g] = M; cml[2 * g + 1] = Ls; }
        }
    }
    if (nsplit == 1) {
        attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
        return;
    }
    cluster_sync_all();  // every split's state is in its block's shared memory
    if (s == 0) {
        if (tid < GQ) {  // every split's (m, l) read once, all in flight together
            float ms_[ATTN_CLUSTER], ls_[ATTN_CLUSTER];
#pragma unroll
            for (int b = 0; b < ATTN_CLUSTER; ++b) {
                ms_[b] = b < nsplit ? ld_cluster_f32(cluster_map(cml + 2 * tid, b)) : NEG_INF;
                ls_[b] = b < nsplit ? ld_cluster_f32(cluster_map(cml + 2 * tid + 1, b)) : 0.0f;
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
            const int g = idx / HD, d = idx % HD;
            float v[ATTN_CLUSTER];
#pragma unroll
            for (int b = 0; b < ATTN_CLUSTER; ++b) v[b] = b < nsplit ? ld_cluster_f32(cluster_map(cpart + idx, b)) : 0.0f;
            float O = 0.0f;
#pragma unroll
            for (int b = 0; b < ATTN_CLUSTER; ++b)
                if (b < nsplit) O = fmaf(v[b], sf[g * ATTN_CLUSTER + b], O);
            out[((long long)r * H + hq0 + g) * HD + d] = O / sL[g];
            ATTN_FIN_STORE(idx, O / sL[g]);
        }
        attn_qx_write<NTHR>(ATTN_FIN, r, hq0, H, qx, qx_b16);
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

// A block with no keys of its row (s >= nsplit): inside a merging cluster it still takes part in
// decode_finish_cluster's two barriers (a cluster barrier waits for every thread of every block);
// blocks of the other clusters just leave.
BW24_DEVICE void decode_idle_split(bool in_cluster, int nsplit, int s) {
#if ATTN_CLUSTER
    if (in_cluster && nsplit > 1 && s < ATTN_CLUSTER) { cluster_sync_all(); cluster_sync_all(); }
#else
    (void)in_cluster; (void)nsplit; (void)s;
#endif
}
