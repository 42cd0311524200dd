// deltanet.cu — the gated DeltaNet token mixer (Yang et al. 2024, "Gated Delta Networks",
// arXiv:2412.06464; transformers modeling_qwen3_next.py Qwen3NextGatedDeltaNet): the causal
// depthwise conv1d with its rolling state, the gated delta rule's recurrence, and the gated
// RMSNorm of its output.  One pass runs T consecutive rows of one sequence: a decode step of
// m = 1..8 rows, or a prefill chunk.  The conv and the norm serve both alike; the recurrence
// serves decode steps and the rows of a prefill pass that deltanet_chunk.cu (the chunked form, on
// tensor cores) leaves to it: a short prompt, a pass's short tail (cuda_deltanet.prefill).
//
// Shape legend: T rows, Hk key heads, Hv value heads (a multiple of Hk), DK key head dim, DV value
// head dim, C = 2 Hk DK + Hv DV conv channels (q | k | v), KC conv taps.
//
// Contracts (NumPy reference: numpy_backend.causal_conv1d_ref, gated_delta_rule_ref,
// gated_rmsnorm_ref, which NumpyOps runs; ops.py states the ops):
//   deltanet_conv      out[t, c] = silu(w[c, 0] x'[t, c] + w[c, 1] x'[t + 1, c] + ... + w[c, KC-1] x'[t + KC-1, c])
//                      over x' = (state | x), state = the layer's last KC - 1 input rows (zeros at the
//                      sequence's start); each product rounded, summed tap by tap oldest first (as
//                      the reference: no FMA), silu(a) = a / (1 + expf(-a)).  The state becomes the
//                      last KC - 1 rows of x'.
//   deltanet_recurrent per row t and value head h (key head kh = h / (Hv / Hk), or h % Hk "tiled"):
//                      q = (q_t / sqrt(S(q_t) + 1e-6)) * scale, k = k_t / sqrt(S(k_t) + 1e-6)
//                      (S: the sum of squares; scale = 1 / sqrt(DK) rounded to f32 by the caller),
//                      beta = 1 / (1 + expf(-b)), g = A * softplus(a + dt_bias) (softplus(x) = x above
//                      20, else log1pf(expf(x))), then on the layer's state S (DK x DV) in this order:
//                        S = S * expf(g);  kv = S^T k;  delta = (v - kv) * beta;  S = S + k delta^T;
//                        o_t = S^T q
//                      every product rounded before its add (no FMA contraction), as the reference.
//                      Sums (S(x), kv_j, o_j): a fixed tree per row, never depending on T or on where
//                      the row falls in the pass: so an m-row step equals m one-row steps bit for bit,
//                      and a prefill pass equals the decode steps over the same inputs bit for bit.
//                        S(x): lane l adds x[l]^2, x[l + 32]^2, ... in order, then the 32-lane xor
//                              butterfly (common.cuh warp_sum);
//                        kv_j, o_j: lane li of the 8 holding column j adds the products of rows
//                              4 li + 32 r + e (r, then e = 0..3, in order), then xor 4, 2, 1.
//   deltanet_gated_norm out[t, h, :] = ((x * rms_inv(sum x^2, DV, eps)) * w) * silu(z) per head of DV
//                      (Qwen3NextRMSNormGated: norm before gate; the sum: lane l adds x[l]^2,
//                      x[l + 32]^2, ... then the butterfly; rms_inv: common.cuh); z's rows ldz
//                      floats apart (a column block of the layer's fused input projection).
//
// State layout (cuda_deltanet.py; float32, one slab per DeltaNet layer):
//   conv state (KC - 1, C) row-major; recurrent state (Hv, DV, DK): per head the transpose of the
//   reference's S (DK x DV), so that the DK values of one column j are contiguous.
// Checkpoints (decode: positions != null): before row t the kernels write the state they hold (the
//   state at position pos[t], having consumed positions < pos[t]) to slot pos[t] % nslot of the
//   checkpoint slabs (slot stride slot_stride floats): the runner's exact rollback within a step.
//
// Launch geometry:
//   deltanet_conv: grid (ceil(C / 128), ceil(T / 64)), 128 threads, one channel per thread and 64
//     rows per block; the block of rows 0.. alone reads and rewrites the state (from x itself when
//     T > 64), so no block reads what another writes.
//   deltanet_recurrent: grid (ceil(DV / 16), Hv), 4 warps; a warp holds 4 columns of S in
//     registers (8 lanes a column, DKP / 8 values a lane: 16 at DK = 128) for the whole pass;
//     rows go through shared memory in tiles of GDN_TT (q, k normalized there, one warp a row;
//     v, expf(g), beta), then the rows of the tile are applied in order.
//   deltanet_gated_norm: one warp per (t, h), 4 warps a block.
//
// Napkin math (Qwen3.5-9B: 24 DeltaNet layers, Hk 16, Hv 32, DK = DV = 128, C = 8192, KC 4):
//   S is 32 x 128 x 128 x 4 B = 2 MiB per layer (48 MiB for the model), the conv state 96 KiB.
//   Decode: the recurrence reads and writes S once per step (4 MiB, ~1.3 us at 3.2 TB/s) plus a
//   2 MiB checkpoint per row, against ~68 MB of the layer's Q8_0 weights (qkv 8192 x 4096, z and
//   out 4096 x 4096): ~6-9 % more bytes than the matvecs read; ~3.7 Mflop per row.  256 blocks
//   of 4 warps: each row's critical path is two 16-term sums and two 3-level butterflies.
//   Rows of a prefill pass that run here: the same recurrence, token by token (~300 cycles a row,
//   a dependent chain); whole 64-row chunks run deltanet_chunk.cu instead, whose rows differ from
//   this kernel's by rounding (~1e-6 relative).
//
// Defines: DK (key head dim, <= 256), KC (conv taps, 2..8), GDN_TT (rows per shared-memory tile).
#include "deltanet_common.cuh"

#ifndef KC
#define KC 4
#endif
#ifndef GDN_TT
#define GDN_TT 32
#endif

#define CONV_NT 128
#define CONV_ROWS 64
#define LPC 8                                      // lanes per column of S
#define CPW (32 / LPC)                             // columns per warp
#define GDN_WARPS 4
#define CB (GDN_WARPS * CPW)                       // columns per block
#define RPL (DKP / (4 * LPC))                      // float4 groups a lane holds (DKP: whole float4 groups of the 8 lanes)
#define GN_WARPS 4

static_assert(KC >= 2 && KC <= 8 && KC - 1 <= CONV_ROWS, "KC: 2..8");

// ============================================================================ conv1d
// (at least 8 blocks an SM: up to 64 registers; ptxas otherwise aims at 32 for some KC and spills)
extern "C" __global__ void __launch_bounds__(CONV_NT, 8)
deltanet_conv(const float* __restrict__ x, int ldx, const float* __restrict__ w, float* __restrict__ state,
              float* __restrict__ out, int T, int C, const int* __restrict__ pos, float* __restrict__ ckpt,
              long long slot_stride, int nslot) {
    pdl_trigger();
    const int c = blockIdx.x * CONV_NT + threadIdx.x;
    const int t0 = blockIdx.y * CONV_ROWS, t1 = min(T, t0 + CONV_ROWS);
    const bool first = blockIdx.y == 0;  // the only block that reads and writes the state
    float wt[KC], win[KC - 1];
    if (c < C) {
#pragma unroll
        for (int j = 0; j < KC; ++j) wt[j] = w[(long long)c * KC + j];
    }
    pdl_wait();  // x comes from the qkv projection, the state from an earlier pass
    if (c >= C) return;
    const float* src = first ? state + c : x + (long long)(t0 - (KC - 1)) * ldx + c;
    const long long ld = first ? C : ldx;
#pragma unroll
    for (int j = 0; j < KC - 1; ++j) win[j] = src[j * ld];
    for (int t = t0; t < t1; ++t) {
        if (ckpt != nullptr) {
            float* ck = ckpt + (long long)(pos[t] % nslot) * slot_stride;
#pragma unroll
            for (int j = 0; j < KC - 1; ++j) ck[(long long)j * C + c] = win[j];
        }
        const float xt = x[(long long)t * ldx + c];
        float acc = __fmul_rn(wt[0], win[0]);
#pragma unroll
        for (int j = 1; j < KC - 1; ++j) acc = __fadd_rn(acc, __fmul_rn(wt[j], win[j]));
        acc = __fadd_rn(acc, __fmul_rn(wt[KC - 1], xt));
        out[(long long)t * C + c] = silu(acc);
#pragma unroll
        for (int j = 0; j < KC - 2; ++j) win[j] = win[j + 1];
        win[KC - 2] = xt;
    }
    if (first) {
        if (T <= CONV_ROWS) {  // this block saw every row: its window is the new state
#pragma unroll
            for (int j = 0; j < KC - 1; ++j) state[(long long)j * C + c] = win[j];
        } else {  // the last KC - 1 rows of x (T > CONV_ROWS >= KC - 1)
#pragma unroll
            for (int j = 0; j < KC - 1; ++j) state[(long long)j * C + c] = x[(long long)(T - (KC - 1) + j) * ldx + c];
        }
    }
}

// ============================================================================ the delta rule
// The sum over the 8 lanes of a column (xor 4, 2, 1): every lane gets the same bits.
BW24_DEVICE float column_sum(float v) {
#pragma unroll
    for (int o = LPC / 2; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// This lane's values of column j's DK-vector at p (rows 4 li + 32 r + e), or stores them.
BW24_DEVICE void col_load(float (&s)[RPL][4], const float* __restrict__ p, bool col, int li) {
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i0 = 4 * li + 4 * LPC * r;
#if DK % 4 == 0
        const float4 v = (col && i0 < DK) ? *reinterpret_cast<const float4*>(p + i0) : make_float4(0.f, 0.f, 0.f, 0.f);
        s[r][0] = v.x, s[r][1] = v.y, s[r][2] = v.z, s[r][3] = v.w;
#else
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][e] = (col && i0 + e < DK) ? p[i0 + e] : 0.0f;
#endif
    }
}

BW24_DEVICE void col_store(const float (&s)[RPL][4], float* __restrict__ p, bool col, int li) {
    if (!col) return;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i0 = 4 * li + 4 * LPC * r;
#if DK % 4 == 0
        if (i0 < DK) *reinterpret_cast<float4*>(p + i0) = make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
#else
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (i0 + e < DK) p[i0 + e] = s[r][e];
#endif
    }
}

// Dynamic shared memory: q and k of GDN_TT rows (DKP each), v of the block's CB columns, expf(g),
// beta (cuda_deltanet.recurrent_smem computes the same).
#define GDN_SMEM_FLOATS (GDN_TT * (2 * DKP + CB + 2))

// (at least 4 blocks an SM: up to 128 registers; without it ptxas for sm_120a stops at 64 and spills)
extern "C" __global__ void __launch_bounds__(GDN_WARPS * 32, 4)
deltanet_recurrent(const float* __restrict__ qkv, int ldq, const float* __restrict__ bproj, int ldb,
                   const float* __restrict__ aproj, int lda, const float* __restrict__ A_,
                   const float* __restrict__ dt_bias, float* __restrict__ S, float* __restrict__ o, int ldo, int T,
                   int Hk, int Hv, int DV, int tiled, float scale, const int* __restrict__ pos, float* __restrict__ ckpt,
                   long long slot_stride, int nslot) {
    extern __shared__ __align__(16) float gsm[];
    float* qs = gsm;                  // [GDN_TT][DKP]
    float* ks = qs + GDN_TT * DKP;    // [GDN_TT][DKP]
    float* vs = ks + GDN_TT * DKP;    // [GDN_TT][CB]
    float* egs = vs + GDN_TT * CB;    // [GDN_TT]
    float* bts = egs + GDN_TT;        // [GDN_TT]
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int li = lane % LPC;
    const int cb = wp * CPW + lane / LPC;  // this lane's column in the block
    const int h = blockIdx.y, c0 = blockIdx.x * CB, j = c0 + cb;
    const bool col = j < DV;
    const int kh = tiled ? h % Hk : h / (Hv / Hk);
    const long long head_cols = (long long)h * DV;
    float* Sj = S + (head_cols + j) * DK;
    pdl_trigger();
    const float A = A_[h], dtb = dt_bias[h];
    pdl_wait();  // q | k | v from the conv, b and a from their projections, S from an earlier pass
    float s[RPL][4];
    col_load(s, Sj, col, li);

    for (int t0 = 0; t0 < T; t0 += GDN_TT) {
        const int nt = min(GDN_TT, T - t0);
        for (int tt = wp; tt < nt; tt += GDN_WARPS) {  // one warp a row: q, k normalized; v; the gates
            const float* row = qkv + (long long)(t0 + tt) * ldq;
            l2norm_row(row + kh * DK, qs + tt * DKP, scale, lane);
            l2norm_row(row + (Hk + kh) * DK, ks + tt * DKP, 1.0f, lane);
            if (lane < CB) vs[tt * CB + lane] = c0 + lane < DV ? row[2 * Hk * DK + head_cols + c0 + lane] : 0.0f;
            if (lane == 0) {
                const long long t = t0 + tt;
                bts[tt] = sigmoid(bproj[t * ldb + h]);
                egs[tt] = expf(gdn_log_decay(aproj[t * lda + h], dtb, A));
            }
        }
        __syncthreads();
        for (int tt = 0; tt < nt; ++tt) {
            const int t = t0 + tt;
            if (ckpt != nullptr) col_store(s, ckpt + (long long)(pos[t] % nslot) * slot_stride + (head_cols + j) * DK, col, li);
            const float eg = egs[tt], beta = bts[tt], v = vs[tt * CB + cb];
            const float4* k4 = reinterpret_cast<const float4*>(ks + tt * DKP);
            const float4* q4 = reinterpret_cast<const float4*>(qs + tt * DKP);
            float kv = 0.0f;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                const float4 k = k4[li + LPC * r];
                const float kk[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[r][e] = __fmul_rn(s[r][e], eg);
                    kv = __fadd_rn(kv, __fmul_rn(s[r][e], kk[e]));
                }
            }
            kv = column_sum(kv);
            const float delta = __fmul_rn(__fsub_rn(v, kv), beta);
            float ov = 0.0f;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                const float4 k = k4[li + LPC * r], q = q4[li + LPC * r];
                const float kk[4] = {k.x, k.y, k.z, k.w}, qq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[r][e] = __fadd_rn(s[r][e], __fmul_rn(kk[e], delta));
                    ov = __fadd_rn(ov, __fmul_rn(s[r][e], qq[e]));
                }
            }
            ov = column_sum(ov);
            if (li == 0 && col) o[(long long)t * ldo + head_cols + j] = ov;
        }
        __syncthreads();  // the next tile refills the rows
    }
    col_store(s, Sj, col, li);
}

// ============================================================================ gated RMSNorm
extern "C" __global__ void __launch_bounds__(GN_WARPS * 32)
deltanet_gated_norm(const float* __restrict__ x, const float* __restrict__ z, int ldz, const float* __restrict__ w,
                    float eps, float* __restrict__ out, int T, int Hv, int DV) {
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const long long item = (long long)blockIdx.x * GN_WARPS + (threadIdx.x >> 5);
    if (item >= (long long)T * Hv) return;
    const long long base = item * DV;  // row t, head h: (t * Hv + h) * DV
    const float* zr = z + (item / Hv) * ldz + (item % Hv) * DV;  // z's rows ldz floats apart
    float ss = 0.0f;
    for (int i = lane; i < DV; i += 32) ss = __fadd_rn(ss, __fmul_rn(x[base + i], x[base + i]));
    const float inv = rms_inv(warp_sum(ss), DV, eps);
    for (int i = lane; i < DV; i += 32)
        out[base + i] = __fmul_rn(__fmul_rn(__fmul_rn(x[base + i], inv), w[i]), silu(zr[i]));
}
