// attention.cu — causal GQA attention over the KV cache: split-K decode (flash-decoding) and
// FlashAttention-2 prefill on tensor cores (mma.sync m16n8k16 bf16, f32 accumulators).
//
// Shape legend: m decode rows (1..8, consecutive positions), T prefill tokens, H query heads,
// K kv heads, G = H/K group size, GQ query heads handled together by one block (a divisor of G),
// NSG = G/GQ, HD head dim, N cache positions (n_ctx), L_r keys attended by decode row r.
//
// Layouts: q float32 [rows, H, HD]; out float32 [rows, H, HD] (= [rows, H*HD]);
//   cache_k / cache_v: one layer, see bw24chat/backends/kernel_refs.py (bf16 uint16 [N, K, HD];
//   q8_0 planar int8 [N, K, HD] + f16 scales [N, K, HD/32]; fp8 planar E4M3 [N, K, HD] + f32
//   scale per head vector [N, K]; f32 float32 [N, K, HD], the exact reference cache).
//   Values = code * scale in float32 (f32: the values themselves).
// NumPy references: kernel_refs.attention_ref (float64, on the dequantized cache) — the tests'
//   target (decode: max rel. error <= 2e-3; prefill: rel. L2 <= 1e-4 with PREFILL_SPLIT=1,
//   <= 5e-3 with 0) — and NumpyBackend.attention (float32) for the same math;
//   kernel_refs.attention_flash_ref(..., operands="bf16x2" | "bf16") emulates the prefill's
//   operand rounding.
// Scores are kept in the log2 domain: s = (q . k) * scale * log2(e), p = exp2(s - max).
//
// ---------------------------------------------------------------- decode (attn_decode)
// Row r attends keys 0..L_r-1, L_r = lengths[r] (device int32, so a CUDA graph replays with new
// lengths).  Split rule (kernel_refs.decode_splits; depends only on L_r and the static
// max_splits, never on m): tiles = ceil(L/TK), per = max(DEC_MIN_PER, ceil(tiles/max_splits)),
// n_split = ceil(tiles/per); split s covers tiles [s*per, min(tiles, (s+1)*per)).
// Grid (m, max_splits, K*NSG), 128 threads; blocks with s >= n_split(L_r) exit at once, so the
// grid never depends on lengths (graph-safe).  Row index is the fastest grid dimension so the m
// rows of one split run side by side and share the K/V tile through L2.
// A block: one row, one kv head, GQ query heads, one split.  K/V tiles of TK=32 keys stream
// through a 3-stage cp.async pipeline in shared memory.  A "sub-warp" of LPK = HD/8 lanes owns
// one key at a time (each lane 8 dims, GQ partial dots reduced by an xor butterfly); the block's
// 4*32/LPK sub-warps take keys sid, sid+NSUB, ... of each tile and keep their own online
// softmax (max m, sum l, acc[GQ][8]).  End of split: sub-warps merged in sub-warp order in
// shared memory; with one split the row is finished there, else (m, l, acc) go to the
// workspace and the last block of (row, kv head, head group) to arrive (atomic counter,
// reset by that block, so the workspace is reusable by the next launch/graph replay) merges the
// splits in split order.  Every step's order is fixed by L_r alone: row results are bit-equal
// whether launched with m = 1 or m = 8 and whatever the other rows hold.
//
// ---------------------------------------------------------------- prefill (attn_prefill)
// Queries t < T at positions start+t (start a plain int: prefill is not graph-captured) attend
// keys 0..start+t (already written by qk_norm_rope_kv_write).  Rows of a block are the
// (token, head) pairs i = t*GQ + g of one kv head's head group, BM = 64 rows (4 warps x 16),
// so the GQ heads share every K/V tile.  Key blocks of BN = 64 at absolute multiples of 64,
// always visited 0, 1, 2, ...: a key block entirely in a row's future leaves that row's state
// bit-unchanged (alpha = exp2(0) = 1, p = 0), so each row's result is identical whatever the
// prefill chunking (tests check 256- vs 512-token chunks bit for bit).
// Grid (ceil(T*GQ/64), K*NSG) (x reversed: the longest tiles start first), 128 threads,
// dynamic smem 2 stages x tiles x 64 x (HD+8) bf16 (PREFILL_SMEM; the wrapper's
// prefill_smem_bytes): tiles = K, V (69632 B at HD=128: needs the opt-in), or with KV_SPLIT
// K_hi, V_hi, K_lo, V_lo (73728 B at HD=64, 139264 B at HD=128: one block per SM).
// bf16 caches: tiles by cp.async (double-buffered).  q8_0/fp8/f32: each value is loaded and
// dequantized to its exact f32 value (code * scale, as the reference), and with PREFILL_SPLIT=1
// (KV_SPLIT) stored as bf16 hi = bf16(v) and lo = bf16(v - hi) tiles, so K and V are exact to
// 2^-17 like Q and P; PREFILL_SPLIT=0 stores bf16(v) only.  Per 16-wide k step the MMAs run in
// the fixed order Q_hi.K_hi, Q_lo.K_hi, Q_hi.K_lo (S) and P_hi.V_hi, P_lo.V_hi, P_hi.V_lo (O),
// so chunk invariance holds as before.  S, O, m, l stay f32.  The two f32 MMA operands (Q, and P for P.V)
// are split-bf16 ("bf16x2", Markidis et al. 2018) when PREFILL_SPLIT=1: x = hi + lo with
// hi = bf16(x), lo = bf16(x - hi) (x - hi exact in f32), and S = Q_hi.K^T + Q_lo.K^T,
// O += P_hi.V + P_lo.V as two MMAs into the same f32 accumulator, per 16-wide k step hi then
// lo (a fixed order: chunk invariance holds as before).  K and V are exact (bf16 cache, or hi+lo), so
// the operands carry ~16 significant bits (residual 2^-17 relative) and the result agrees with
// the float64 reference to ~1e-5.  PREFILL_SPLIT=0: Q and P rounded to bf16 (~2e-3, 2x fewer MMAs).
//
// Defines: HD (64/128; any of 32/64/128/256 for decode), GQ (heads per block, decode <= 8),
//          KV_TYPE (0 bf16, 1 q8_0, 2 fp8, 3 f32), PREFILL_SPLIT (1: bf16x2 Q and P, and K, V
//          for non-bf16 caches, default; 0: bf16).
#include "common.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef GQ
#define GQ 4
#endif
#ifndef KV_TYPE
#define KV_TYPE 0
#endif
#ifndef PREFILL_SPLIT
#define PREFILL_SPLIT 1
#endif
#ifndef ATTN_ABLATE  // decode timing diagnostics only (bench/attn_probe.py, BW24CHAT_ATTN_ABLATE), results garbage:
// bit 0: no cross-split merge (each split writes its partial, no fence / arrival count / last
// block); bit 1 (attn_decode_tc): no tile arithmetic (loads and waits kept); bit 2
// (attn_decode_tc): no K/V tile loads; bit 3: the last block stops right after its arrival
// (fences and the arrival count kept, no merge loads or arithmetic); bit 4: no fences around
// the arrival count (wrong ordering, timing only).  What each removed part costs on the critical
// path (s13e: bit 0 took 7.76 -> 2.96 us at 512 keys, 18.96 -> 12.21 at 8192; a merge with one
// fence per block and prefetched partials measured the same as this one, s13f).
#define ATTN_ABLATE 0
#endif
#ifndef ATTN_QX  // decode (cuda_ops attn_decode qx_out; the runner's default, BW24CHAT_ATTN_QX=0 off): 1 = the block that finishes
// a (row, kv head, head group) also writes the integer-dot codes of its GQ * HD outputs (matvec.cu's
// QX layout, common.cuh qx_write_block; rounded to bf16 first when qx_b16) into the o projection's
// QX row, so the o matvec copies them (prologue "qx") instead of every block quantizing all H * HD
// inputs after pdl_wait (that prologue: 2.0-2.2 us of NVFP4 / Q8_0's o, bench/NOTES.md, nineteenth
// session).  The outputs themselves are unchanged (the same stores; the codes from a copy of them
// in shared memory).
#define ATTN_QX 0
#endif
#ifndef DEC_MIN_PER  // decode: at least this many key tiles per split (fewer splits to merge at short context)
#define DEC_MIN_PER 1
#endif

#define KV_BF16 0
#define KV_Q8_0 1
#define KV_FP8 2
#define KV_F32 3

#if KV_TYPE == KV_BF16
#define ES 2  // code bytes per value
#define SCB 0  // scale bytes per key row
#elif KV_TYPE == KV_Q8_0
#define ES 1
#define SCB (HD / 16)
#elif KV_TYPE == KV_FP8
#define ES 1
#define SCB 4
#elif KV_TYPE == KV_F32
#define ES 4
#define SCB 0
#else
#error "KV_TYPE must be 0 (bf16), 1 (q8_0), 2 (fp8) or 3 (f32)"
#endif
#define ROWB (HD * ES)
#define KV_SCALED (KV_TYPE == KV_Q8_0 || KV_TYPE == KV_FP8)  // values = code * per-row scale

#define NEG_INF (-__int_as_float(0x7f800000))

// ------------------------------------------------------------------ small helpers
// (smem_addr, cp_async16 / cp_async4 / commit / wait: common.cuh)

// 4 E4M3 codes (bytes of x, low first) -> 4 floats / 256 (exact: E4M3 placed in f16 bits; the
// caller folds the 2^8 into the scale).
BW24_DEVICE void e4m3x4_to_f32_div256(uint32_t x, float* o) {
    const uint32_t lo = ((x & 0x00800080u) << 8) | ((x & 0x007F007Fu) << 7);  // bytes 0, 2
    const uint32_t hi = (x & 0x80008000u) | ((x & 0x7F007F00u) >> 1);        // bytes 1, 3
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    o[0] = a.x; o[1] = b.x; o[2] = a.y; o[3] = b.y;
}

// 8 stored values starting at p (16 B of bf16, 8 B of codes or 32 B of f32) -> float32 codes.
BW24_DEVICE void load8(const uint8_t* p, float* o) {
#if KV_TYPE == KV_BF16
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
#elif KV_TYPE == KV_Q8_0
    const uint2 u = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[i] = (float)(int8_t)(u.x >> (8 * i));
        o[4 + i] = (float)(int8_t)(u.y >> (8 * i));
    }
#elif KV_TYPE == KV_FP8
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    e4m3x4_to_f32_div256(u.x, o);
    e4m3x4_to_f32_div256(u.y, o + 4);
#else
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
#endif
}

// The float32 scale that multiplies the codes of dims [d0, d0+8) of a key row whose scale bytes
// start at sp (shared or global).
BW24_DEVICE float row_scale(const uint8_t* sp, int d0) {
#if KV_TYPE == KV_Q8_0
    return __half2float(reinterpret_cast<const __half*>(sp)[d0 / 32]);
#elif KV_TYPE == KV_FP8
    return *reinterpret_cast<const float*>(sp) * 256.0f;
#else
    (void)sp; (void)d0;
    return 1.0f;  // bf16, f32: no scale
#endif
}

// =================================================================== decode
#define DTHREADS 128
#define TK 32
#define STAGES 3
#define LPK (HD / 8)           // lanes per key
#define KPW (32 / LPK)         // keys per warp step
#define NSUB (4 * KPW)         // sub-warps per block
#define KPS (TK / NSUB)        // keys per sub-warp per tile
#define STAGE_BYTES (2 * TK * ROWB + 2 * TK * SCB)

static_assert(LPK >= 1 && LPK <= 32 && (32 % LPK) == 0, "HD/8 must divide 32");
static_assert(TK % NSUB == 0, "tile must split evenly over sub-warps");
static_assert(GQ >= 1, "GQ");

// Dynamic shared memory the decode kernel needs (the wrapper computes the same number).
#define DECODE_MERGE_BYTES (NSUB * GQ * (HD + 2) * 4)
#define DECODE_SMEM (STAGES * STAGE_BYTES > DECODE_MERGE_BYTES ? STAGES * STAGE_BYTES : DECODE_MERGE_BYTES)

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
    if (ATTN_ABLATE & 1) return;

    // ---- last block of (row, kv head, head group) merges the splits, in split order
    if (!(ATTN_ABLATE & 16)) __threadfence();
    __syncthreads();
    int* cnt = ws_cnt + ((long long)r * K * NSG + blockIdx.z);
    if (tid == 0) s_last = atomicAdd(cnt, 1) == nsplit - 1;
    __syncthreads();
    if (!s_last) return;
    if (ATTN_ABLATE & 8) {
        if (tid == 0) *cnt = 0;
        return;
    }
    if (!(ATTN_ABLATE & 16)) __threadfence();
    // Every L2 round trip here is paid once per layer on the critical path (this block runs
    // last), so loads go out together: all nsplit (m, l) pairs at once into shared memory, then
    // the split weights f_b = exp2(m_b - M) and Ls per head from shared memory, then each
    // (head, dim) output sums its partials with 16 loads in flight.  Same operations in the same
    // order as the first version, which chained 2*nsplit dependent L2 loads; measured on the
    // H200 this took the kernel from 13.1 to 11.9 us per layer at 512 keys and 28.6 to 25.1 us
    // at 8192 (bench/NOTES.md).  Removing the merge altogether (ATTN_ABLATE bit 0, thirteenth
    // session) takes 7.8 -> 3.0 us at 512 keys and 19.0 -> 12.2 at 8192: it is the largest single
    // cost at short context; one fence per block and prefetched partials did not reduce it.
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
#ifndef ATTN_HYBRID  // attn_decode with ATTN_CLUSTER: 0 (always the cluster), or P (see attn_decode)
#define ATTN_HYBRID 0
#endif
#if ATTN_CLUSTER
// ATTN_CLUSTER = C (both decode kernels; sm_90+): the C split blocks of
// one (row, kv head, head group) form a thread-block cluster (grid y = max_splits = C), and the
// splits are merged through distributed shared memory instead of the global workspace: each block
// leaves its (m, l, O) in its own shared memory, a cluster barrier, the split-0 block reads every
// split's state (mapa + ld.shared::cluster) and merges them exactly as decode_finish's last block
// does (same operations, same order: the same bits as the workspace merge with max_splits = C),
// a second barrier keeps the others alive until it has read them.  Why: removing the merge took
// 7.8 -> 3.0 us per layer at 512 keys and 19.0 -> 12.2 at 8192 (bench/NOTES.md, thirteenth
// session), and the workspace merge is a chain of global fences, an arrival count and L2 loads.
// Blocks with s >= nsplit take part in both barriers (a cluster barrier waits for every thread of
// every block); with nsplit == 1 nobody waits (nsplit is the same for the whole cluster).
// Measured (H200, fourteenth session, bench/attn_probe.py, us per layer at 512 / 2048 / 8192 keys,
// bf16 cache): workspace merge 7.79 / 10.35 / 18.99, C = 8 4.99 / 7.56 / 21.01, C = 16 6.56 /
// 8.75 / 16.75; Qwen3-8B NVFP4 decode tg128@512 / @8192 439.2 / 335.7 -> 476.7 / 372.9 (C = 8),
// 462.6 / 373.5 (C = 16).  Shared memory after the NPART parts: this split's O [GQ][HD], (m, l)
// [GQ][2], split weights [GQ][C], sums [GQ] (cuda_ops _decode_smem / _decode_tc_smem).
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
    per = max(DEC_MIN_PER, (tiles + cap - 1) / cap);
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

extern "C" __global__ void __launch_bounds__(DTHREADS) ATTN_CLUSTER_DIMS
attn_decode(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
            const int* __restrict__ lengths, int H, int K, int n_ctx, int max_splits, int max_rows, float scale_log2,
            float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt, uint32_t* __restrict__ qx, int qx_b16) {
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
        for (int c = tid; c < TK * ROWB / 16; c += DTHREADS) {
            const int kk = c / (ROWB / 16), off = (c % (ROWB / 16)) * 16;
            const int j = key0 + kk;
            const bool ok = j < L;
            const long long g = ((long long)(ok ? j : 0) * K + h) * ROWB + off;
            cp_async16(base + kk * ROWB + off, cache_k + g, ok ? 16 : 0);
            cp_async16(base + TK * ROWB + kk * ROWB + off, cache_v + g, ok ? 16 : 0);
        }
#if SCB > 0
        for (int c = tid; c < TK * SCB / 4; c += DTHREADS) {
            const int kk = c / (SCB / 4), off = (c % (SCB / 4)) * 4;
            const int j = key0 + kk;
            const bool ok = j < L;
            const long long g = scale_plane + ((long long)(ok ? j : 0) * K + h) * SCB + off;
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
#if ATTN_CLUSTER
    if (in_cluster) {
        decode_finish_cluster<NSUB>(smem, macc, mm, ml, r, s, nsplit, hq0, H, out, qx, qx_b16);
        return;
    }
#endif
    decode_finish<NSUB>(smem, macc, mm, ml, r, s, nsplit, hq0, H, K, NSG, max_splits, max_rows, out, ws, ws_cnt, qx, qx_b16);
}

// =================================================================== prefill
#define PTHREADS 128
#define BM 64
#define BN 64
#define LDK (HD + 8)  // bf16 elements per shared row: 16 B pad keeps ldmatrix/LDS conflict-free
#define PTILE_ELEMS (BN * LDK)
// KV_SPLIT: K and V enter the MMAs as exact f32 split into bf16 hi + lo tiles (q8_0, fp8, f32
// caches with PREFILL_SPLIT=1); bf16 caches hold exact bf16 values already.
#define KV_SPLIT (KV_TYPE != KV_BF16 && PREFILL_SPLIT)
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
// PREFILL_SMEM <= 227 KB for HD <= 128 (the prefill's head dims; HD=256 builds serve decode only
// with KV_SPLIT, and the wrapper refuses a launch above the limit).

BW24_DEVICE uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// (x, y) -> packed bf16 hi = bf16(x, y) and lo = bf16((x, y) - hi): x ~= hi + lo to 2^-17.
BW24_DEVICE void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = pack_bf16(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
}

BW24_DEVICE void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

BW24_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// 8 f32 values -> bf16 at hi (and, with KV_SPLIT, the bf16 residuals at lo); 16-B stores.
BW24_DEVICE void store8_tile(__nv_bfloat16* hi, __nv_bfloat16* lo, const float* v) {
#if KV_SPLIT
    uint4 h, l;
    split_bf16x2(v[0], v[1], h.x, l.x);
    split_bf16x2(v[2], v[3], h.y, l.y);
    split_bf16x2(v[4], v[5], h.z, l.z);
    split_bf16x2(v[6], v[7], h.w, l.w);
    *reinterpret_cast<uint4*>(hi) = h;
    *reinterpret_cast<uint4*>(lo) = l;
#else
    (void)lo;
    uint4 h;
    h.x = pack_bf16(v[0], v[1]); h.y = pack_bf16(v[2], v[3]);
    h.z = pack_bf16(v[4], v[5]); h.w = pack_bf16(v[6], v[7]);
    *reinterpret_cast<uint4*>(hi) = h;
#endif
}

// Fill one stage (the K and V tiles of key block kb, plus their lo tiles with KV_SPLIT) for kv
// head h; keys >= kv_len are zero.  bf16: cp.async (committed as one group); other types:
// loaded, dequantized to exact f32 (code * scale, the reference's float32 product) and stored
// synchronously.  The caller separates this fill from the reads of the same stage by barriers.
BW24_DEVICE void prefill_load(__nv_bfloat16* stage, const uint8_t* __restrict__ ck, const uint8_t* __restrict__ cv,
                              int kb, int kv_len, int K, int h, long long scale_plane) {
    __nv_bfloat16* sK = stage;
    __nv_bfloat16* sV = stage + PTILE_ELEMS;
    for (int c = threadIdx.x; c < BN * HD / 8; c += PTHREADS) {
        const int kk = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
        const int j = kb * BN + kk;
        const bool ok = j < kv_len;
        const long long row = (long long)(ok ? j : 0) * K + h;  // cache row (pos * K + head)
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

// min 2 blocks/SM (<= 255 registers): without it ptxas capped the PREFILL_SPLIT=1, HD=64
// q8_0/fp8 variants at 128 registers and spilled.  (KV_SPLIT at HD=128 needs 136 KB of shared
// memory: one block per SM.)
extern "C" __global__ void __launch_bounds__(PTHREADS, 2)
attn_prefill(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
             int T, int H, int K, int start, int n_ctx, float scale_log2, float* __restrict__ out) {
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
#if PREFILL_SPLIT
    uint32_t ql[HD / 16][4];  // Q lo part
#endif
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
        const int c = kt * 16 + c2;
        const float2 a0 = va ? *reinterpret_cast<const float2*>(q + qa_off + c) : make_float2(0.f, 0.f);
        const float2 b0 = vb ? *reinterpret_cast<const float2*>(q + qb_off + c) : make_float2(0.f, 0.f);
        const float2 a1 = va ? *reinterpret_cast<const float2*>(q + qa_off + c + 8) : make_float2(0.f, 0.f);
        const float2 b1 = vb ? *reinterpret_cast<const float2*>(q + qb_off + c + 8) : make_float2(0.f, 0.f);
#if PREFILL_SPLIT
        split_bf16x2(a0.x, a0.y, qf[kt][0], ql[kt][0]);
        split_bf16x2(b0.x, b0.y, qf[kt][1], ql[kt][1]);
        split_bf16x2(a1.x, a1.y, qf[kt][2], ql[kt][2]);
        split_bf16x2(b1.x, b1.y, qf[kt][3], ql[kt][3]);
#else
        qf[kt][0] = pack_bf16(a0.x, a0.y);
        qf[kt][1] = pack_bf16(b0.x, b0.y);
        qf[kt][2] = pack_bf16(a1.x, a1.y);
        qf[kt][3] = pack_bf16(b1.x, b1.y);
#endif
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, la = 0.0f, lb = 0.0f;

    prefill_load(tiles, cache_k, cache_v, 0, kv_len, K, h, scale_plane);
    for (int kb = 0; kb < nkb; ++kb) {
#if PREFILL_STAGES == 1
        const int st = 0;
        // the one stage was last read in iteration kb-1, which ended with a barrier: fill it
        if (kb > 0) prefill_load(tiles, cache_k, cache_v, kb, kv_len, K, h, scale_plane);
#if KV_TYPE == KV_BF16
        cp_async_wait<0>();
#endif
#else
        const int st = kb & 1;
        // Stage st^1 was last read in iteration kb-1, which ended with a barrier: refill it.
        if (kb + 1 < nkb) {
            prefill_load(tiles + (st ^ 1) * PSTAGE_ELEMS, cache_k, cache_v, kb + 1, kv_len, K, h, scale_plane);
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
#if PREFILL_SPLIT
                mma_bf16(sc[nt], ql[kt], b0, b1);
#endif
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
#if PREFILL_SPLIT
            uint32_t pa4[4], pl4[4];
            split_bf16x2(sc[2 * kk][0], sc[2 * kk][1], pa4[0], pl4[0]);
            split_bf16x2(sc[2 * kk][2], sc[2 * kk][3], pa4[1], pl4[1]);
            split_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], pa4[2], pl4[2]);
            split_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], pa4[3], pl4[3]);
#else
            const uint32_t pa4[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                                     pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                     pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#endif
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
#if PREFILL_SPLIT
                mma_bf16(o[2 * dp], pl4, b[0], b[1]);
#endif
#if KV_SPLIT
                mma_bf16(o[2 * dp], pa4, bl[0], bl[1]);
#endif
                mma_bf16(o[2 * dp + 1], pa4, b[2], b[3]);
#if PREFILL_SPLIT
                mma_bf16(o[2 * dp + 1], pl4, b[2], b[3]);
#endif
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

// =================================================================== decode on tensor cores
// attn_decode_tc: the contract of attn_decode (grid, split rule with TK = TCK, workspace, merge,
// rows bit-equal for any m) for bf16 caches and HD <= 128, with the dot products on mma.sync
// m16n8k16 bf16 instead of FMAs.  Why: the FMA kernel is instruction-bound (Nsight Compute on the
// H200: ~100 warp-instructions per key and head group, 0.95 us per 32-key tile per block, 1.4 TB/s
// at 8192 keys, bench/NOTES.md); here a 64-key tile costs ~600 warp-instructions per block.
// Math (as the precise prefill): per block one row r, one kv head, GQ query heads as MMA rows
// g = lane/4 < GQ (rows g+8 and g >= GQ are zero).  Q (f32) enters as bf16 hi + lo (x = hi + lo
// to 2^-17), K and V are exact bf16; S = Q_hi.K + Q_lo.K (per 16-wide k step hi then lo, one f32
// accumulator chain), masked to keys < L_r, scaled to the log2 domain; online softmax per warp;
// P = exp2(S - m) split the same way, O += P_hi.V + P_lo.V.  Agreement with the float64 reference
// ~1e-5 (the FMA kernel: ~1e-7; the tolerance of both is 2e-3).
// Geometry: 128 threads = 4 warps (256 with TC_HALVES = 2, below); a block tile is TCK = 64 keys
// of K and V (rows padded to LDK bf16: conflict-free fragment loads), TCSTAGES-deep cp.async
// pipeline; warp w owns keys
// 16w..16w+15 of every tile, in increasing tile order, with its own (m, l, O); the four warps are
// merged in warp order by decode_finish (as the FMA kernel's sub-warps).  Every step's order is
// fixed by L_r alone.  Under PDL the first TCSTAGES-1 tiles are fetched before pdl_wait, except the
// keys >= L_r - max_rows that this step's cache write may have produced (fetched after it).
// Running rope.cu's prologue (QK-norm, RoPE, cache write) inside this kernel instead, after
// pdl_wait, was bit-identical but slower in the decode step (NVFP4 tg128@8192 -4 %, eighteenth
// session, bench/NOTES.md; commit 17aaa13): it puts that work on every block's critical path.
//
// TC_HALVES = 2: the block is two such 4-warp halves (256 threads).  Half hf computes the local tiles
// hf, hf + 2, hf + 4, ... of the split: step j of the loop holds tiles 2j and 2j + 1, each half
// with its own (m, l, O) per warp, so two tiles' MMA / softmax chains run side by side on the SM
// (one 4-warp block per SM leaves one warp per scheduler: the per-tile chain latency, not the
// bytes, bound the kernel — bench/NOTES.md, ninth / thirteenth sessions: more stages alone did not
// help).  The ring holds TCSTAGES / TC_HALVES steps.  The eight warps are merged in warp order
// (half 0's warps, then half 1's).  Every order is still fixed by L_r alone.
#define TCK 64
#ifndef TC_HALVES  // 1 or 2 four-warp halves per block (cuda_ops.decode_tc_config)
#define TC_HALVES 1
#endif
#ifndef TCSTAGES  // pipeline depth in tiles (cuda_ops.decode_tc_config; BW24CHAT_ATTN_TC_STAGES for experiments)
#define TCSTAGES (TC_HALVES == 2 ? 4 : 3)
#endif
#define TC_THREADS (128 * TC_HALVES)
#define TC_RING (TCSTAGES / TC_HALVES)  // steps of TC_HALVES tiles in the ring
static_assert(TC_HALVES == 1 || TC_HALVES == 2, "TC_HALVES is 1 or 2");
static_assert(TCSTAGES % TC_HALVES == 0 && TC_RING >= 2, "TCSTAGES: a multiple of TC_HALVES, at least two steps");
#define TC_STAGE_ELEMS (2 * TCK * LDK)
#define DECODE_TC_SMEM (TCSTAGES * TC_STAGE_ELEMS * 2)  // the wrapper computes the same number
#if ATTN_CLUSTER
static_assert((4 * TC_HALVES * GQ * (HD + 2) + GQ * HD + 2 * GQ + GQ * ATTN_CLUSTER + GQ) * 4 <= DECODE_TC_SMEM,
              "decode_finish_cluster's shared memory (parts, this split's state, split weights) fits the pipeline's");
#endif

#ifndef ATTN_ISSUE_HOIST  // 1 (opt-in, cuda_ops BW24CHAT_ATTN_ISSUE_HOIST=1; not yet run on a GPU):
#define ATTN_ISSUE_HOIST 0   // attn_decode_tc's cp.async issue loop unrolled with its cache addresses
#endif                       // hoisted (see issue)
// Why: the loop's trip count depends on tid for the compiler, and each chunk recomputed its 64-bit
// cache address (~25 instructions per K / V pair, ~200 per step of two tiles, issued in order
// before the step's MMA chain); hoisted, the tile loop is 529 instead of 818 instructions and 206
// instead of 215 registers (HD 128, two halves; nvdisasm, twenty-third session).
static_assert(!ATTN_ISSUE_HOIST || (TC_THREADS % (HD / 8) == 0 && (TCK * (HD / 8)) % TC_THREADS == 0),
              "ATTN_ISSUE_HOIST: a tile's chunks are a whole number of the block's, each thread's KSTEP keys apart");
#if KV_TYPE == KV_BF16 && HD <= 128
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2 / TC_HALVES) ATTN_CLUSTER_DIMS
attn_decode_tc(const float* __restrict__ q, const uint8_t* __restrict__ cache_k, const uint8_t* __restrict__ cache_v,
               const int* __restrict__ lengths, int H, int K, int n_ctx, int max_splits, int max_rows, float scale_log2,
               float* __restrict__ out, float* __restrict__ ws, int* __restrict__ ws_cnt, uint32_t* __restrict__ qx, int qx_b16) {
    pdl_trigger();
    extern __shared__ __align__(16) uint8_t smem[];
    __nv_bfloat16* tiles = reinterpret_cast<__nv_bfloat16*>(smem);  // [stage][K, V][TCK][LDK]
    (void)n_ctx;
    const int r = blockIdx.x, s = blockIdx.y;
    const int L = lengths[r];  // written before the step's first kernel: readable before pdl_wait
    if (L <= 0) { pdl_wait(); return; }
    const int ntiles_all = (L + TCK - 1) / TCK;
    bool in_cluster;
    int per, nsplit;
    decode_split_plan(ntiles_all, max_splits, in_cluster, per, nsplit);
    if (s >= nsplit) {
        pdl_wait();
        decode_idle_split(in_cluster, nsplit, s);
        return;
    }
    const int t0 = s * per, ntile = min(ntiles_all, t0 + per) - t0;
    const int G = H / K, NSG = G / GQ;
    const int h = blockIdx.z / NSG, sg = blockIdx.z % NSG;
    const int hq0 = h * G + sg * GQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hf = warp >> 2;  // this warp's half (TC_HALVES == 2): it computes local tiles hf, hf + 2, ...
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    const bool gv = g < GQ;
    const int nstep = (ntile + TC_HALVES - 1) / TC_HALVES;

    // Keys >= fresh may have been written by the previous kernel (this step's rope / cache write:
    // the newest m <= max_rows positions); older keys were written by earlier steps.  So the first
    // stages are fetched before pdl_wait without the fresh keys (their memory latency overlaps the
    // previous kernel), and the fresh keys of those stages after it.  Keys >= L are zero-filled
    // (V rows meet p = 0: they must be finite).  mode 0: before the wait (keys < fresh, zeros for
    // keys >= L, nothing in between); 1: the fresh keys only; 2: every key < L, zeros after.
    const int fresh = L - max_rows;
#if ATTN_ISSUE_HOIST
    // this thread's 16-byte chunks of a tile: dims d8.. of keys kk0 + KSTEP * i (the loop below,
    // unrolled: the same chunks in the same order), their cache addresses from one per tile
    constexpr int CPR = HD / 8, KSTEP = TC_THREADS / CPR;
    const int kk0 = tid / CPR, d8 = (tid % CPR) * 8;
    const long long key_bytes = (long long)K * HD * 2;  // one key of the cache (every head)
    const uint8_t* gk0 = cache_k + ((long long)h * HD + d8) * 2;  // key 0's chunk: also the zero-fill's address
    const uint8_t* gv0 = cache_v + ((long long)h * HD + d8) * 2;
#endif
    auto issue = [&](int tile, int st, int mode) {
        if (ATTN_ABLATE & 4) return;
        __nv_bfloat16* sK = tiles + st * TC_STAGE_ELEMS;
        __nv_bfloat16* sV = sK + TCK * LDK;
        const int key0 = tile * TCK;
#if ATTN_ISSUE_HOIST
        const uint8_t* gk = gk0 + (key0 + kk0) * key_bytes;
        const uint8_t* gv = gv0 + (key0 + kk0) * key_bytes;
#pragma unroll
        for (int i = 0; i < TCK / KSTEP; ++i) {
            const int kk = kk0 + KSTEP * i, j = key0 + kk;
            const bool ok = j < L;
            if ((mode == 0 && ok && j >= fresh) || (mode == 1 && (!ok || j < fresh))) continue;
            const long long off = i * KSTEP * key_bytes;
            cp_async16(sK + kk * LDK + d8, ok ? gk + off : gk0, ok ? 16 : 0);
            cp_async16(sV + kk * LDK + d8, ok ? gv + off : gv0, ok ? 16 : 0);
        }
#else
        for (int c = tid; c < TCK * HD / 8; c += TC_THREADS) {
            const int kk = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
            const int j = key0 + kk;
            const bool ok = j < L;
            if ((mode == 0 && ok && j >= fresh) || (mode == 1 && (!ok || j < fresh))) continue;
            const long long row = (long long)(ok ? j : 0) * K + h;
            cp_async16(sK + kk * LDK + d8, cache_k + (row * HD + d8) * 2, ok ? 16 : 0);
            cp_async16(sV + kk * LDK + d8, cache_v + (row * HD + d8) * 2, ok ? 16 : 0);
        }
#endif
    };
    // step j's tiles: local tiles j * TC_HALVES + hh in stages (j % TC_RING) * TC_HALVES + hh
    auto issue_step = [&](int j, int mode) {
#pragma unroll
        for (int hh = 0; hh < TC_HALVES; ++hh) {
            const int tl = j * TC_HALVES + hh;
            if (tl < ntile && (mode != 1 || (t0 + tl + 1) * TCK > fresh)) issue(t0 + tl, (j % TC_RING) * TC_HALVES + hh, mode);
        }
    };
#pragma unroll
    for (int j = 0; j < TC_RING - 1; ++j) {
        issue_step(j, 0);
        cp_async_commit();
    }
    pdl_wait();  // q and the fresh keys come from the previous kernel
    // the fresh keys of the prefetched stages (one more group; the first wait below drains all)
    const bool refill = (t0 + min(ntile, (TC_RING - 1) * TC_HALVES)) * TCK > fresh;
    if (refill) {
#pragma unroll
        for (int j = 0; j < TC_RING - 1; ++j) issue_step(j, 1);
        cp_async_commit();
    }

    // Q as A fragments (rows g; rows g+8 are zero): hi and lo parts
    uint32_t qh[HD / 16][2], ql[HD / 16][2];
    const float* qrow = q + ((long long)r * H + hq0 + (gv ? g : 0)) * HD;
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
        const float2 a0 = gv ? *reinterpret_cast<const float2*>(qrow + kt * 16 + c2) : make_float2(0.f, 0.f);
        const float2 a1 = gv ? *reinterpret_cast<const float2*>(qrow + kt * 16 + c2 + 8) : make_float2(0.f, 0.f);
        split_bf16x2(a0.x, a0.y, qh[kt][0], ql[kt][0]);
        split_bf16x2(a1.x, a1.y, qh[kt][1], ql[kt][1]);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_ = NEG_INF, l_ = 0.0f;
    const int kw = (warp & 3) * 16;  // this warp's keys within a tile

    for (int j = 0; j < nstep; ++j) {
        if (j == 0 && refill)
            cp_async_wait<0>();
        else
            cp_async_wait<TC_RING - 2>();
        __syncthreads();  // step j's tiles visible to all; everyone is done with step j-1's stages
        if (j + TC_RING - 1 < nstep) issue_step(j + TC_RING - 1, 2);
        cp_async_commit();
        const int it = j * TC_HALVES + hf;  // this half's local tile
        if (it >= ntile) continue;          // an odd tile count: half 1 has no last tile
        const __nv_bfloat16* sK = tiles + ((j % TC_RING) * TC_HALVES + hf) * TC_STAGE_ELEMS;
        const __nv_bfloat16* sV = sK + TCK * LDK;
        const int key0 = (t0 + it) * TCK + kw;
        if (ATTN_ABLATE & 2) continue;

        // S (rows g, keys kw + 8nt + c2, +1) = (Q_hi.K over even k steps + Q_hi.K over odd ones)
        // + (the same for Q_lo): four independent accumulator chains per 8 keys, interleaved over
        // both 8-key groups, so the MMA latency (~30 cycles) overlaps instead of adding up along
        // one chain of 2*HD/16 (the first version: ~1 us per tile, bench/NOTES.md).
        float sc[2][4];
        {
            float ch[2][4][4];  // [nt][Q_hi even, Q_hi odd, Q_lo even, Q_lo odd]
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) ch[nt][c][0] = ch[nt][c][1] = ch[nt][c][2] = ch[nt][c][3] = 0.0f;
#pragma unroll
            for (int kt = 0; kt < HD / 16; ++kt) {
                const uint32_t ah[4] = {qh[kt][0], 0u, qh[kt][1], 0u};
                const uint32_t al[4] = {ql[kt][0], 0u, ql[kt][1], 0u};
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
        float mx = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int key = key0 + nt * 8 + c2;
            sc[nt][0] = key < L ? sc[nt][0] * scale_log2 : NEG_INF;
            sc[nt][1] = key + 1 < L ? sc[nt][1] * scale_log2 : NEG_INF;
            mx = fmaxf(mx, fmaxf(sc[nt][0], sc[nt][1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_, mx);
        const float base = mn == NEG_INF ? 0.0f : mn;  // no valid key yet: p = 0, state unchanged
        const float alpha = exp2f(m_ - base);
        m_ = mn;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            sc[nt][0] = exp2f(sc[nt][0] - base);
            sc[nt][1] = exp2f(sc[nt][1] - base);
            rs += sc[nt][0] + sc[nt][1];
        }
        rs += __shfl_xor_sync(0xffffffffu, rs, 1);
        rs += __shfl_xor_sync(0xffffffffu, rs, 2);
        l_ = __fmaf_rn(l_, alpha, rs);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) { o[n][0] *= alpha; o[n][1] *= alpha; }

        // O += P_hi.V + P_lo.V over the warp's 16 keys (one k step), 8 dims per MMA
        uint32_t ph[4], pl[4];
        split_bf16x2(sc[0][0], sc[0][1], ph[0], pl[0]);
        split_bf16x2(sc[1][0], sc[1][1], ph[2], pl[2]);
        ph[1] = ph[3] = pl[1] = pl[3] = 0u;
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
    float* macc = reinterpret_cast<float*>(smem);  // [4 * TC_HALVES][GQ][HD]
    float* mm = macc + 4 * TC_HALVES * GQ * HD;     // [4 * TC_HALVES][GQ]
    float* ml = mm + 4 * TC_HALVES * GQ;
    if (gv) {
#pragma unroll
        for (int n = 0; n < HD / 8; ++n)
            *reinterpret_cast<float2*>(macc + (warp * GQ + g) * HD + n * 8 + c2) = make_float2(o[n][0], o[n][1]);
        if (c2 == 0) { mm[warp * GQ + g] = m_; ml[warp * GQ + g] = l_; }
    }
    __syncthreads();
#if ATTN_CLUSTER
    if (in_cluster) {
        decode_finish_cluster<4 * TC_HALVES, TC_THREADS>(smem, macc, mm, ml, r, s, nsplit, hq0, H, out, qx, qx_b16);
        return;
    }
#endif
    decode_finish<4 * TC_HALVES, TC_THREADS>(smem, macc, mm, ml, r, s, nsplit, hq0, H, K, NSG, max_splits, max_rows, out,
                                             ws, ws_cnt, qx, qx_b16);
}
#endif
