// matvec.cu — decode matrix-vector products on the repacked quantized weights.
//
// Contract
//   matvec(wq, wh, ws, wd, gscale, x, out, normw, n_out, n_in, ldx, tk, pro, epi, eps)
//     for m < MV_M (compile-time, 1..8), o < n_out:
//       y[m, o] = gs[o] * sum_k W[o, k] * xin[m, k]       (gs = gscale[o] for NVFP4, else 1)
//       epi 0 (store): out[m*n_out + o] = y;   epi 1 (add, the residual): out[...] += y
//       epi 2 (swiglu, n_out even, rows interleaved gate_i, up_i):
//                      out[m*(n_out/2) + i] = swiglu_act(y[m, 2i], y[m, 2i+1])  (common.cuh)
//     prologue pro (xin from the raw x, row stride ldx floats):
//       0 none:   xin = x[m, k]
//       1 rmsnorm: xin = (x[m,k] * inv_m) * normw[k], inv_m = 1/sqrt(sum_k x[m,k]^2 / n_in + eps)
//                 (numpy_backend.rmsnorm; the sum has one fixed order, identical in every
//                 block and for every MV_M)
//       2 swiglu: xin = silu(x[m, k]) * x[m, n_in + k] = g / (1 + exp(-g)) * u (ldx >= 2*n_in)
//     pro | PRO_BF16 (8, the bf16-activation contract, common.cuh bf16_round): xin rounded to
//                 bf16 after the prologue, before it is staged or quantized (qx_out's codes too)
//       3 qx (ACT_Q8 only): xin's codes come ready-made from qx_in (below), quantized once by the
//                 kernel that produced xin; the staged words and records are the ones prologue 0
//                 would build from those floats, so the rows are bit-identical to it.
//   qx_out (ACT_Q8, epi 2, tiles of MV_NW*MV_R = 64 rows, n_out/2 a multiple of 32): besides out,
//   the block writes the integer-dot codes of its tile's 32 outputs (one 32-input block of the
//   next matvec's x) to qx_out, so the down projection's prologue copies them instead of every
//   block re-quantizing all F inputs (~21 % of an NVFP4 decode step went to the prologues:
//   bench/NOTES.md, tenth session).  QX layout per token m (uint32 words, n = the inputs, row
//   stride qx_row_words(n) = 5n/8): [0, n/4) h codes, [n/4, n/2) l codes (natural order, 4 int8
//   per word), then n/32 int4 records {e, sum h of inputs 0-15, of 16-31, sum l of 0-15 | (sum l of
//   16-31) << 16} (cuda_linear.qx_ref is the NumPy mirror).
//   NumPy reference: out = xin @ W.T with W = QTensor.dequantize() (cuda_weights.decode_planes).
//   ACT_Q8=1 (the integer-dot contract, quantized formats): xin is first quantized per block of
//   32 inputs into two int8 code levels (common.cuh act_quant_lane: xin ~ 2^e (h + l/256)), and
//   y = sum over chunks and levels of dot * a * s (+ b * sum(codes) * s with a min), dot = the
//   exact integer sum of weight code * x code (dp4a), s = 2^e or 2^(e-8); NVFP4 joins the two
//   levels in the integer: y = sum over half chunks of (256 dot_h + dot_l) * a * 2^(e-8), one
//   rounding per half chunk (|256 dot_h + dot_l| < 2^23: exact in f32); reference:
//   act_quant_ref(xin) @ W.T.
//
// Exactness: the per-output reduction tree does not depend on MV_M, MV_R or tk: lane L of the
// warp owning row o takes the chunks kc = L (mod 32) of the row in increasing order; in each
// chunk it forms dot = sum_e q_e * x_e over the chunk (two chains for 4-bit formats: values
// 0-15 and 16-31), then acc += a*dot (+ b*xsum for formats with a min, xsum = the chunk's sum
// of x in natural order) — all explicit __fmaf_rn/__fadd_rn; then warp_sum (fixed xor tree).
// So row m of an MV_M=8 call equals the MV_M=1 call on that row bit for bit.  Float formats
// (F32/F16/BF16) do acc = fma(w, x, acc) value by value.  Weights are decoded exactly (the
// scale factored out of the chunk dot: a*sum(q*x) instead of sum((a*q)*x), a rounding
// difference only; q are exact small integers).
//
// Layout / geometry: MV_NW warps (8, or 16 below), MV_R consecutive rows per warp (each x value
// read from shared memory feeds MV_R rows), tiles of MV_NW*MV_R rows; persistent grid (below).  x (after the prologue)
// is staged per k-tile of tk values (tk a multiple of WT = 32*VPC) in shared memory as
// xs[m][tk] in a swizzled order: value e of the chunk that lane L reads in warp-tile w sits at
// w*WT + (e/4)*128 + 4L + e%4, so each float4 read of a warp is 512 contiguous bytes
// (conflict-free).  Dynamic shared: 4*(MV_M*tk + MV_M*tk/32 + MV_M*MV_NW) bytes.
// Each lane keeps MV_U - 1..MV_U chunks x MV_R rows of 16-byte loads in flight (rolling window).
#include "common.cuh"
#include "formats.cuh"

#ifndef MV_M
#define MV_M 1
#endif
#ifndef MV_R
#define MV_R 2
#endif
#ifndef MV_U  // chunk slots of the rolling load window per lane and row (fewer for large MV_M: registers)
// Measured (H200, Qwen3-8B shapes, bench/matvec_variants.py): Q8_0 with the rolling window 4 slots
// beat 7 on every shape (gate|up 40.5 vs 46.8 us; the batch-then-consume loop had wanted 8).
// Q5_K / Q6_K spill at 4 slots with the window's extra chunk copy: 3.
// Integer-dot path (ACT_Q8): the most slots that compile without spills at its register
// budget (below): Q8_0 3 (80 registers), the 4-bit family and Q6_K 2 (80 / 128), Q5_K 3 (122).
#if ACT_Q8 && MV_M <= 2
#define MV_U ((FMT == F_Q8_0 || FMT == F_Q5_K) ? 3 : 2)
#elif MV_M == 1 && (FMT == F_Q5_K || FMT == F_Q6_K)
#define MV_U 3
#else
#define MV_U (MV_M <= 2 ? 4 : 2)
#endif
#endif
#ifndef MV_STEADY  // 1: branch-free steady-state windows in the main loop (see there; cuda_linear picks it)
#define MV_STEADY 0
#endif
#ifndef ACT_Q8  // 1: the integer-dot contract below (quantized formats only)
#define ACT_Q8 0
#endif
#if ACT_Q8 && IS_FLOAT_FMT
#error "ACT_Q8 is the integer-dot path of the quantized formats"
#endif
#ifndef A8_JOIN  // integer-dot path: both code levels joined in one integer per dot (chunk_dot_a8)
// Q4_K measured (H200, ninth session, us, joined / two levels): qkv 9.6 / 9.9, gate|up 21.4 / 23.0,
// down 14.1 / 14.9, LM head 37.0 / 40.8; decode tg128@512 406.8 / 378.2 tok/s (same call)
#define A8_JOIN (FMT == F_NVFP4 || FMT == F_Q4_K)
#endif
#if A8_JOIN && FMT != F_NVFP4 && FMT != F_Q4_K
#error "A8_JOIN: NVFP4 and Q4_K only (256 dot_h + dot_l must stay below 2^24)"
#endif
#ifndef MV_MINB  // blocks per SM the register budget must allow (2 = at most 128, 3 = 80 registers)
// Float formats at m = 1: 3 (80 registers instead of 89 with the rolling window; measured BF16
// qkv 23.4 -> 17.8 us, gate|up 65.5 -> 55.4, LM head 125.5 -> 104.9 on the H200).  The 4-bit and
// 8-bit float decoders need ~115-128 registers: 2; the integer-dot path fits 80 (Q5_K/Q6_K: 2).
#define MV_MINB (MV_M == 1 ? ((IS_FLOAT_FMT || (ACT_Q8 && FMT != F_Q5_K && FMT != F_Q6_K)) ? 3 : 2) : 1)
#endif
#ifndef MV_NW  // warps per block: 8; 16 (an experiment, cuda_linear BW24CHAT_MV_NW) where the prologue has no
// rmsnorm statistic, whose summation order follows the block size (rms_inv_rows, stage_a8).  Why 16:
// every block quantizes / stages the whole x in its prologue, ~21 % of an NVFP4 decode step (tenth
// session, MV_ABLATE); one block of 16 warps per SM does that once per SM instead of twice.  The
// rows' values do not depend on it (per-lane chunk order, warp_sum; the x codes are per 32 inputs).
#define MV_NW 8
#endif
#if MV_NW != 8 && MV_NW != 16
#error "MV_NW: 8 or 16 warps per block"
#endif
#define MV_NT (MV_NW * 32)
#ifndef MV_STAT8  // 1 (16 warps only; an experiment, cuda_linear BW24CHAT_MV_STAT8): the rmsnorm statistic
// is summed by the first 8 warps in the 8-warp kernel's order, so a 16-warp block gives the 8-warp
// kernel's rows bit for bit with the rmsnorm prologue too (the staging after it uses every warp)
#define MV_STAT8 0
#endif
#if MV_STAT8 && MV_NW != 16
#error "MV_STAT8: the 8-warp statistic inside a 16-warp block"
#endif
#ifndef QX_HANDOFF  // how qx_out's tile outputs reach warp 0 (cuda_linear.qx_handoff picks 2, measured there):
// 0: one tile buffer, a block barrier before warp 0 quantizes and one after (the buffer is reused);
// 1: two tile buffers by tile parity, only the first barrier (warp 0 has read buffer p before it
//    reaches the next tile's barrier, which every writer of buffer p two tiles on has passed);
// 2: two buffers and named barriers, producer / consumer (PTX bar.arrive / bar.sync): warps 1..
//    MV_NW-1 arrive on FULL[p] without waiting, warp 0 waits on it, quantizes, and arrives on
//    EMPTY[p]; a warp waits on EMPTY[p] only before writing buffer p again two tiles later.  So no
//    warp but warp 0 waits for the tile's slowest warp or for the quantization.
#define QX_HANDOFF 0
#endif
#ifndef QX_ROTATE  // 1 (opt-in, cuda_linear BW24CHAT_QX_ROTATE=1; prepared in the twenty-second session,
// not yet measured): the quantizing warp of the block's tile ordinal t is warp t % MV_NW instead of
// warp 0, so no warp does the quantization (and waits on the tile's slowest warp) more than once in
// MV_NW tiles: with warp 0 on every tile (gate|up: 3 tiles per block) its lag adds up and the
// block ends with it.  Under QX_HANDOFF 2 the warp that read buffer p two tiles before (warp
// (t - 2) % MV_NW) is the one that arrives on EMPTY[p], every other warp waits on it.  The same
// words (qx_write_block is one function of the 32 outputs, whichever warp runs it).
#define QX_ROTATE 0
#endif
#define QX_BUFS (QX_HANDOFF ? 2 : 1)  // tile buffers of MV_M * 32 floats (the wrapper allocates as many)
#define QX_BAR_FULL 1   // named barrier ids of QX_HANDOFF 2: FULL[p] = 1 + p, EMPTY[p] = 3 + p (0 is __syncthreads)
#define QX_BAR_EMPTY 3
#define STAT_NT (MV_STAT8 ? 256 : MV_NT)  // threads that sum the rmsnorm statistic
#define STAT_NW (STAT_NT / 32)
#define WT (32 * VPC)

#define PRO_NONE 0
#define PRO_RMS 1
#define PRO_SWIGLU 2
#define PRO_QX 3
#define PRO_BF16 8  // flag: the matmul input rounded to bf16 (the contract above)
#define EPI_STORE 0
#define EPI_ADD 1
#define EPI_SWIGLU 2  // rows interleaved gate_i, up_i: out[m, i] = silu(y[2i]) * y[2i+1]
// The swiglu epilogue pairs rows (2i, 2i+1) inside one warp: an even MV_R (cuda_linear._simt_geometry
// raises otherwise; odd MV_R builds, 3 rows for the qkv projection, never take that epilogue).

#ifndef XF_NR  // float path: float4 groups per thread and batch of the x prologue (2 at 80 registers: spills)
#define XF_NR (MV_MINB >= 3 ? 2 : 4)
#endif
// The float path reads x in float4 GROUPS (values 4f..4f+3 of a row): thread tid takes the groups
// f = b0 + tid + NT*i (i < XF_NR) of each batch b0, all of the batch's loads issued before any use,
// so a batch costs one round trip to L2.  (The scalar loops this replaced, 4 loads in flight per
// thread, cost 4 round trips per 4096 inputs for the statistic and 4 more for the staging, 6 for
// the 12288 inputs of a down projection: bench/NOTES.md, nineteenth session.)  vec: x, ldx, n_in
// (and normw) allow 16-byte loads; otherwise four guarded scalar loads give the same values.
// Values at or past n read as 0.
BW24_DEVICE float4 load_group(const float* __restrict__ xr, int f, int n, bool vec) {
    if (vec) return reinterpret_cast<const float4*>(xr)[f];
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = 4 * f + e < n ? xr[4 * f + e] : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
}

// s plus the squares of NR float4 groups, in the order (i, x, y, z, w) by FMA: one step of the
// rmsnorm statistic, the same in the float path (rms_inv_rows) and the integer-dot one (stage_a8)
template <int NR>
BW24_DEVICE float add_squares(const float4 (&v)[NR], float s) {
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        s = __fmaf_rn(v[i].x, v[i].x, s);
        s = __fmaf_rn(v[i].y, v[i].y, s);
        s = __fmaf_rn(v[i].z, v[i].z, s);
        s = __fmaf_rn(v[i].w, v[i].w, s);
    }
    return s;
}

// The rmsnorm statistic of the MV_M rows of x for the float path (pro == PRO_RMS; else inv = 1):
// inv[m] = rms_inv(sum_k x[m, k]^2), the sum in one fixed order (each thread's groups in the order
// (b0, i, x, y, z, w) by FMA, warp_sum, the warps in order), the same for every MV_M; with
// MV_STAT8 the first 8 warps sum it in the 8-warp order.  red: MV_M * MV_NW floats.
BW24_DEVICE void rms_inv_rows(const float* __restrict__ x, int ldx, int n_in, int pro, float eps, bool vec, float* red,
                              float (&inv)[MV_M]) {
#pragma unroll
    for (int m = 0; m < MV_M; ++m) inv[m] = 1.0f;
    if (pro != PRO_RMS) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n4 = (n_in + 3) / 4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss[MV_M];
#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
        float s = 0.0f;
        for (int b0 = 0; b0 < n4 && (!MV_STAT8 || tid < STAT_NT); b0 += STAT_NT * XF_NR) {
            float4 v[XF_NR];
#pragma unroll
            for (int i = 0; i < XF_NR; ++i) {
                const int f = b0 + tid + STAT_NT * i;
                v[i] = f < n4 ? load_group(x + (long)m * ldx, f, n_in, vec) : zero;
            }
            s = add_squares(v, s);
        }
        ss[m] = warp_sum(s);
    }
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < MV_M; ++m) red[m * MV_NW + warp] = ss[m];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
        float s = red[m * MV_NW];
#pragma unroll
        for (int w = 1; w < STAT_NW; ++w) s = __fadd_rn(s, red[m * MV_NW + w]);
        inv[m] = rms_inv(s, n_in, eps);
    }
}

// natural position t in a k-tile -> its swizzled shared-memory index (layout: the header); the
// values t..t+3 of a group (t % 4 == 0, VPC a multiple of 4) are contiguous there
BW24_DEVICE int swizzle(int t) {
    const int w = t / WT, rem = t - w * WT;
    const int L = rem / VPC, e = rem - L * VPC;
    return w * WT + (e >> 2) * 128 + 4 * L + (e & 3);
}

// rmsnorm applied to one value: (x * inv) * w, the order numpy_backend.rmsnorm uses
BW24_DEVICE float rms_apply(float v, float inv, float w) { return __fmul_rn(__fmul_rn(v, inv), w); }

BW24_DEVICE float prologue_x(const float* __restrict__ x, long off, int p, int n_in, int pro, float inv,
                             const float* __restrict__ normw) {
    const float v = x[off + p];
    if (pro == PRO_RMS) return rms_apply(v, inv, normw[p]);
    if (pro == PRO_SWIGLU) return swiglu_act(v, x[off + n_in + p]);
    return v;
}

#if !ACT_Q8
// The float path's staging of k-tile [k0, k0 + tkk) of the MV_M rows: x' = prologue(x) (rms_apply
// with inv[m] and normw, or swiglu_act with the up half x[m, n_in + k]) into xs[m][tk] at the
// swizzled positions, by the float4 groups of load_group (one L2 round trip per batch).  The same
// values as prologue_x gives element by element.
BW24_DEVICE void stage_float_x(const float* __restrict__ x, int ldx, int n_in, int k0, int tkk, int tk, int pro,
                               const float (&inv)[MV_M], const float* __restrict__ normw, bool vec, bool xb16, float* xs) {
    const int tid = threadIdx.x, g4 = (tkk + 3) / 4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
    for (int m = 0; m < MV_M; ++m) {
        const float* xr = x + (long)m * ldx + k0;
        for (int b0 = 0; b0 < g4; b0 += MV_NT * XF_NR) {
            float4 a[XF_NR], w[XF_NR];
#pragma unroll
            for (int i = 0; i < XF_NR; ++i) {
                const int f = b0 + tid + MV_NT * i;
                const bool ok = f < g4;
                a[i] = ok ? load_group(xr, f, tkk, vec) : zero;
                w[i] = zero;
                if (ok && pro == PRO_RMS) w[i] = load_group(normw + k0, f, tkk, vec);
                if (ok && pro == PRO_SWIGLU) w[i] = load_group(xr + n_in, f, tkk, vec);
            }
#pragma unroll
            for (int i = 0; i < XF_NR; ++i) {
                const int f = b0 + tid + MV_NT * i;
                if (f >= g4) continue;
                float4 v = a[i];
                if (pro == PRO_RMS)
                    v = make_float4(rms_apply(v.x, inv[m], w[i].x), rms_apply(v.y, inv[m], w[i].y),
                                    rms_apply(v.z, inv[m], w[i].z), rms_apply(v.w, inv[m], w[i].w));
                else if (pro == PRO_SWIGLU)
                    v = make_float4(swiglu_act(v.x, w[i].x), swiglu_act(v.y, w[i].y), swiglu_act(v.z, w[i].z),
                                    swiglu_act(v.w, w[i].w));
                if (xb16) v = bf16_round4(v);
                float* dst = xs + m * tk + swizzle(4 * f);
                if (4 * f + 4 <= tkk) {
                    *reinterpret_cast<float4*>(dst) = v;
                } else {  // the row's last, partial group
                    const float t[4] = {v.x, v.y, v.z, v.w};
                    for (int e = 0; 4 * f + e < tkk; ++e) dst[e] = t[e];
                }
            }
        }
    }
}
#endif

// one chunk of MV_R rows against MV_M x rows; xb = xs + warp-tile*WT + 4*lane
BW24_DEVICE void chunk_dot(const Raw (&raw)[MV_R], int kc, const float* xb, int tk, const float* xsb, int xss,
                           float (&acc)[MV_M][MV_R]) {
#if IS_FLOAT_FMT
    (void)kc; (void)xsb; (void)xss;
#pragma unroll
    for (int g = 0; g < VPC / 4; ++g) {
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            const float4 xv = *reinterpret_cast<const float4*>(xb + m * tk + g * 128);
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                acc[m][r] = __fmaf_rn(fval(raw[r], 4 * g + 0), xv.x, acc[m][r]);
                acc[m][r] = __fmaf_rn(fval(raw[r], 4 * g + 1), xv.y, acc[m][r]);
                acc[m][r] = __fmaf_rn(fval(raw[r], 4 * g + 2), xv.z, acc[m][r]);
                acc[m][r] = __fmaf_rn(fval(raw[r], 4 * g + 3), xv.w, acc[m][r]);
            }
        }
    }
#else
    float a0[MV_R], a1[MV_R], b[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; ++r) chunk_scales(raw[r], kc, a0[r], a1[r], b[r]);
#if FMT == F_Q8_0
    (void)xsb; (void)xss;
    float dot[MV_M][MV_R];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        float q[MV_R][4];
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
            const uint32_t w = word_of(raw[r].q, g) ^ 0x80808080u;
#pragma unroll
            for (int j = 0; j < 4; ++j) q[r][j] = qval(w, j);
        }
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            const float4 xv = *reinterpret_cast<const float4*>(xb + m * tk + g * 128);
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                float d = g == 0 ? __fmul_rn(q[r][0], xv.x) : __fmaf_rn(q[r][0], xv.x, dot[m][r]);
                d = __fmaf_rn(q[r][1], xv.y, d);
                d = __fmaf_rn(q[r][2], xv.z, d);
                dot[m][r] = __fmaf_rn(q[r][3], xv.w, d);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MV_M; ++m)
#pragma unroll
        for (int r = 0; r < MV_R; ++r) acc[m][r] = __fmaf_rn(a0[r], dot[m][r], acc[m][r]);
#else
    float dlo[MV_M][MV_R], dhi[MV_M][MV_R];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        float ql[MV_R][4], qh[MV_R][4];
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
            uint32_t lo, hi;
            qwords(raw[r], g, lo, hi);
            qvals4(lo, ql[r]);
            qvals4(hi, qh[r]);
        }
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            const float4 xl = *reinterpret_cast<const float4*>(xb + m * tk + g * 128);
            const float4 xh = *reinterpret_cast<const float4*>(xb + m * tk + (4 + g) * 128);
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                float d = g == 0 ? __fmul_rn(ql[r][0], xl.x) : __fmaf_rn(ql[r][0], xl.x, dlo[m][r]);
                d = __fmaf_rn(ql[r][1], xl.y, d);
                d = __fmaf_rn(ql[r][2], xl.z, d);
                dlo[m][r] = __fmaf_rn(ql[r][3], xl.w, d);
                float e = g == 0 ? __fmul_rn(qh[r][0], xh.x) : __fmaf_rn(qh[r][0], xh.x, dhi[m][r]);
                e = __fmaf_rn(qh[r][1], xh.y, e);
                e = __fmaf_rn(qh[r][2], xh.z, e);
                dhi[m][r] = __fmaf_rn(qh[r][3], xh.w, e);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
#if HAS_MIN
        const float xsum = xsb[m * xss];
#else
        (void)xsb; (void)xss;
#endif
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
#if TWO_SCALES
            acc[m][r] = __fmaf_rn(a0[r], dlo[m][r], acc[m][r]);
            acc[m][r] = __fmaf_rn(a1[r], dhi[m][r], acc[m][r]);
#else
            acc[m][r] = __fmaf_rn(a0[r], __fadd_rn(dlo[m][r], dhi[m][r]), acc[m][r]);
#if HAS_MIN
            acc[m][r] = __fmaf_rn(b[r], xsum, acc[m][r]);
#endif
#endif
        }
    }
#endif
#endif
}

#if ACT_Q8
// ---- the integer-dot path.  Shared x per token m and plane p (0: the high codes h, 1: the low
// codes l; common.cuh act_quant_lane): the int8 codes as u32 words (wpm = n_in/4 per plane), and
// one uint4 per 32-input block {plane scale as float bits (2^e, 2^(e-8)), code sum of inputs
// 0-15, of 16-31, of all 32}; with A8_JOIN (both levels in one integer dot, chunk_dot_a8) one
// record per block in plane 0's place: NVFP4 {2^(e-1) (the weights' 2^7 folded in:
// nvfp4_scales_f16), seed of inputs 0-15, of 16-31 (-128 * (256 * sum h + sum l): removes the
// weight bytes' offset 128), 0}; Q4_K {2^(e-8), 0, 0, the block's x sum 2^(e-8) (256 * sum h +
// sum l) as float bits (exact)}.  Word layout: Q8_0 (16-value chunks) natural order, a chunk = 4 words at 4*kc;
// 32-value chunks two halves (inputs 0-15 of chunk kc at words 4*kc.., 16-31 at 4*(nck+kc)..)
// so that each lane's 16-byte read is conflict-free.  Token m, plane p: words at
// xw + (2m+p)*wpm, records at meta + (2m+p)*nb.
BW24_DEVICE int a8_word(int p, int nck) {
#if VPC == 16
    (void)nck;
    return p >> 2;
#else
    return (((p & 31) >> 4) * nck + (p >> 5)) * 4 + ((p & 15) >> 2);
#endif
}

// The integer-dot prologue of the MV_M tokens: xin (prologue applied) quantized per 32-block into
// the two planes' words and records (token m: xw + 2m*wpm, meta + 2m*nb).  Thread tid takes the
// float4 groups f = b0 + tid + MV_NT*i (i < A8_NR) of each batch b0, all its loads issued before
// any use, so a row of up to MV_NT*A8_NR*4 = 4096 inputs costs one round trip to L2 (the scalar
// per-element reads this replaced cost one per 1024 inputs, twice with rmsnorm: the first read
// for the statistic, the second for the staging) and, with rmsnorm, stays in registers between
// the statistic and the staging.  The rmsnorm statistic: each thread's squares in the order (b0,
// i, x, y, z, w) by FMA, warp_sum, then the MV_NW warps in order — the same for every MV_M.
// Every thread runs the same trip count (the group reductions are shuffles).  red: MV_NW floats.
// (A version that copied the row to shared memory by cp.async — one round trip per row, no
// registers held — measured 1-2 us slower per matvec and 6-9 % slower decode: bench/NOTES.md,
// eighth session.)
// The staged record(s) of 32-input block b from its exponent and code sums (h / l levels, inputs
// 0-15 and 16-31); one writer for stage_a8 and stage_qx, so both stage the same bits.
BW24_DEVICE void a8_records(uint4* metam, int nb, int b, int e, int sh0, int sh1, int sl0, int sl1) {
#if FMT == F_NVFP4
    metam[b] = make_uint4(__float_as_uint(pow2f(e - 1)), (uint32_t)(-128 * (256 * sh0 + sl0)),
                          (uint32_t)(-128 * (256 * sh1 + sl1)), 0u);
    (void)nb;
#elif A8_JOIN  // Q4_K: 2^(e-8) and the block's exact x sum 2^(e-8) * (256 * sum h + sum l)
    metam[b] = make_uint4(__float_as_uint(pow2f(e - 8)), 0u, 0u,
                          __float_as_uint(__fmul_rn((float)(256 * (sh0 + sh1) + sl0 + sl1), pow2f(e - 8))));
    (void)nb;
#else
    metam[b] = make_uint4(__float_as_uint(pow2f(e)), (uint32_t)sh0, (uint32_t)sh1, (uint32_t)(sh0 + sh1));
    metam[nb + b] = make_uint4(__float_as_uint(pow2f(e - 8)), (uint32_t)sl0, (uint32_t)sl1, (uint32_t)(sl0 + sl1));
#endif
}

// Prologue 3 (qx): the MV_M tokens' words and records from the QX buffer (layout: contract at the
// top), one 32-input block per thread and pass: its 2 x 32 code bytes and record are one L2 round
// trip, written to the staged positions (a8_word: 32-value chunks keep inputs 0-15 of chunk kc at
// words 4kc.., 16-31 at 4(nck+kc)..; Q8_0's 16-value chunks are in natural order).
BW24_DEVICE void stage_qx(const uint32_t* __restrict__ qx, int n_in, uint32_t* xw, uint4* meta) {
    const int nck = n_in / VPC, wpm = n_in / 4, nb = n_in / 32;
    for (int m = 0; m < MV_M; ++m) {
        const uint32_t* q = qx + (long)m * qx_row_words(n_in);
        const uint4* q4 = reinterpret_cast<const uint4*>(q);
        const int4* rec = reinterpret_cast<const int4*>(q + n_in / 2);
        uint32_t* xwm = xw + 2 * m * wpm;
        uint4* metam = meta + 2 * m * nb;
        for (int b = threadIdx.x; b < nb; b += MV_NT) {
            const uint4 h0 = q4[2 * b], h1 = q4[2 * b + 1];
            const uint4 l0 = q4[wpm / 4 + 2 * b], l1 = q4[wpm / 4 + 2 * b + 1];
            const int4 r = rec[b];
            uint4* dst = reinterpret_cast<uint4*>(xwm);
            dst[a8_word(32 * b, nck) / 4] = h0;
            dst[a8_word(32 * b + 16, nck) / 4] = h1;
            dst[(wpm + a8_word(32 * b, nck)) / 4] = l0;
            dst[(wpm + a8_word(32 * b + 16, nck)) / 4] = l1;
            a8_records(metam, nb, b, r.x, r.y, r.z, (int)(short)(r.w & 0xFFFF), r.w >> 16);
        }
    }
}

#ifndef A8_NR  // float4 groups per thread and batch: 4 where the register budget allows (2 at 80 registers: spills)
#define A8_NR (MV_MINB >= 3 ? 2 : 4)
#endif
#ifndef A8_STAT_CACHE  // rmsnorm prologue of the integer-dot path in ONE L2 round trip (the default since
// the twenty-second session; cuda_linear BW24CHAT_A8_STAT_CACHE=0 turns it off): where one batch
// of the statistic's loads holds the whole row (n_in / 4 <= STAT_NT * A8_NR: qkv, gate|up and the LM
// head of 4096-input models), the norm weights come in that batch too and the statistic's threads
// stage exactly the groups they hold — under MV_STAT8 (16-warp blocks) the other 8 warps stage
// nothing.  Without it a 16-warp block reads x twice after pdl_wait (the statistic's batch, then the
// staging's, with the norm weights), and the 8-warp cached path reads the norm weights in a second
// round trip.  Each group is staged by the same code from the same values (the aligned 8-lane group
// of 32 inputs is unchanged: consecutive lanes hold consecutive groups), so the codes and records
// are the same bits (tests/gpu/test_matvec.py, 36 cases on an H100).  Measured (H100, s22a, us, off /
// on): NVFP4 qkv 9.2 / 9.0, Q4_K qkv 10.3 / 9.7, gate|up 25.0 / 24.1, Q8_0 qkv 12.9 / 12.5; decode
// tg128@512 NVFP4 437.4-437.9 / 439.4, Q4_K 416.6-425.9 / 433.1-433.4, Q8_0 299.4-299.8 / 299.8-301.6
// tok/s.  (The eighth session's A8_SMEM — the row copied to shared memory by cp.async — lost 1-2 us
// per matvec for reasons not found; this keeps the registers' path.)
#define A8_STAT_CACHE 1
#endif
BW24_DEVICE void stage_a8(const float* __restrict__ x, int ldx, int n_in, int pro, float eps,
                          const float* __restrict__ normw, bool xb16, uint32_t* xw, uint4* meta, float* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n4 = n_in / 4, nck = n_in / VPC, wpm = n_in / 4, nb = n_in / 32;
    const float4* w4 = reinterpret_cast<const float4*>(normw);
#if A8_STAT_CACHE  // the statistic's loads (x and the norm weights) serve the staging; see A8_STAT_CACHE
    const bool cached = pro == PRO_RMS && n4 <= STAT_NT * A8_NR;
#else
    const bool cached = !MV_STAT8 && pro == PRO_RMS && n4 <= MV_NT * A8_NR;  // the statistic's loads serve the staging
#endif
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int m = 0; m < MV_M; ++m) {
        const float4* x4 = reinterpret_cast<const float4*>(x + (long)m * ldx);
        uint32_t* xwm = xw + 2 * m * wpm;
        uint4* metam = meta + 2 * m * nb;
        float4 v[A8_NR];
#if A8_STAT_CACHE
        float4 wc[A8_NR];  // the norm weights of the groups in v (cached)
#endif
        float inv = 1.0f;
        if (pro == PRO_RMS) {
            float ss = 0.0f;
            for (int b0 = 0; b0 < n4 && (!MV_STAT8 || tid < STAT_NT); b0 += STAT_NT * A8_NR) {
#pragma unroll
                for (int i = 0; i < A8_NR; ++i) {
                    const int f = b0 + tid + STAT_NT * i;
                    v[i] = f < n4 ? x4[f] : zero;
#if A8_STAT_CACHE
                    if (cached) wc[i] = f < n4 ? __ldg(w4 + f) : zero;
#endif
                }
                ss = add_squares(v, ss);
            }
            ss = warp_sum(ss);
            if (lane == 0) red[warp] = ss;
            __syncthreads();
            float s = red[0];
#pragma unroll
            for (int w = 1; w < STAT_NW; ++w) s = __fadd_rn(s, red[w]);
            inv = rms_inv(s, n_in, eps);
            __syncthreads();  // red[] is the next token's
        }
        // group f (a = x, w = the prologue's second operand) -> xin -> the two code planes and records
        auto stage = [&](int f, float4 a, float4 w) {
            const bool ok = f < n4;
            if (pro == PRO_RMS)
                a = make_float4(rms_apply(a.x, inv, w.x), rms_apply(a.y, inv, w.y), rms_apply(a.z, inv, w.z), rms_apply(a.w, inv, w.w));
            else if (pro == PRO_SWIGLU)
                a = make_float4(swiglu_act(a.x, w.x), swiglu_act(a.y, w.y), swiglu_act(a.z, w.z), swiglu_act(a.w, w.w));
            if (!ok) a = zero;
            if (xb16) a = bf16_round4(a);
            int e, sh, sl;
            uint32_t ql;
            const uint32_t qh = act_quant_lane(a, e, ql, sh, sl);
            const int sh_other = __shfl_xor_sync(0xffffffffu, sh, 4), sl_other = __shfl_xor_sync(0xffffffffu, sl, 4);
            if (!ok) return;
            xwm[a8_word(4 * f, nck)] = qh;
            xwm[wpm + a8_word(4 * f, nck)] = ql;
            if ((lane & 7) == 0)  // lanes 0-3 hold inputs 0-15, lanes 4-7 inputs 16-31
                a8_records(metam, nb, f >> 3, e, sh, sh_other, sl, sl_other);
        };
#if A8_STAT_CACHE
        if (cached) {  // one batch held the row: its threads stage their own groups (whole warps: shuffles)
            if (tid < STAT_NT)
#pragma unroll
                for (int i = 0; i < A8_NR; ++i) stage(tid + STAT_NT * i, v[i], wc[i]);
            continue;
        }
#endif
        for (int b0 = 0; b0 < n4; b0 += MV_NT * A8_NR) {
            float4 wv[A8_NR];
#pragma unroll
            for (int i = 0; i < A8_NR; ++i) {
                const int f = b0 + tid + MV_NT * i;
                const bool ok = f < n4;
                if (!cached) v[i] = ok ? x4[f] : zero;
                wv[i] = pro == PRO_RMS && ok ? __ldg(w4 + f) : zero;  // the prologue's second operand:
                if (pro == PRO_SWIGLU) wv[i] = ok ? x4[n4 + f] : zero;  // the norm weights, or swiglu's up half
            }
#pragma unroll
            for (int i = 0; i < A8_NR; ++i) stage(b0 + tid + MV_NT * i, v[i], wv[i]);
        }
    }
}

BW24_DEVICE int dp4a_s8(uint32_t a, uint32_t b, int c) {  // signed bytes of a . signed bytes of b + c
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
BW24_DEVICE int dp4a_u8(uint32_t a, uint32_t b, int c) {  // unsigned bytes of a . signed bytes of b + c
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// the exact float of an integer |i| < 2^22 without I2F (quarter rate): (1.5 * 2^23 + i) - 1.5 * 2^23
BW24_DEVICE float small_int_float(int i) { return __fsub_rn(__int_as_float(0x4B400000 + i), 12582912.0f); }

#define A8_OFF ((int)QOFF)  // the weight bytes' offset, removed through the dp4a seed

#if FMT == F_NVFP4
BW24_DEVICE uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {  // PTX prmt, default mode (bit 3: sign replicate)
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
// Four NVFP4 codes as selector nibbles (bits 0-15; bit 3 of each the sign) -> bytes (doubled
// value + 128, unsigned 116..140), byte j = code j.  PRMT's default mode replicates the selected
// byte's sign bit when the selector's bit 3 is set, and every table byte is < 0x80: so pos = the
// doubled magnitude where the sign is clear, else 0, and neg the same on the flipped selectors;
// pos + 128 - neg per byte has no carry or borrow (one IADD3).  Code 8 (-0) gives 128 (+0).
// A selector word (formats.cuh: the codes of values 4g+j in bits 0-15, of 16+4g+j in 16-31) ->
// the weight-byte words of both halves: 9 operations per 8 codes (the nibble-chunk layout this
// replaced needed ~19 with the selector shuffles: bench/NOTES.md, ninth session).
// t0 = 0x03020100 (table bytes 0-3) comes from the caller in a register: PRMT's first operand must
// be one, and ptxas otherwise re-materialized the constant before every PRMT (85 extra moves per
// 8 row chunks in the steady loop; nvdisasm, ninth session).
BW24_DEVICE void nvfp4_weight_bytes(uint32_t w, uint32_t t0, uint32_t& lo, uint32_t& hi) {
    const uint32_t t1 = 0x0C080604u;  // doubled E2M1 magnitudes 0,1,2,3 (t0), 4,6,8,12
    const uint32_t n = w ^ 0x88888888u;
    lo = prmt(t0, t1, w) + 0x80808080u - prmt(t0, t1, n);
    hi = prmt(t0, t1, w >> 16) + 0x80808080u - prmt(t0, t1, n >> 16);
}
// The chunk's two block scales (values 0-15, 16-31) as E4M3 * 2^-8 (= ue4m3_half * 2^-7; the
// 2^7 rides in the x record's 2^(e-1)): the repacked scale bytes 2p, 2p+1 of the record word
// (p = kc & 1) moved under f16x2 bits 7-13 by one PRMT and a shift, then converted exactly.
BW24_DEVICE void nvfp4_scales_f16(uint32_t sw, int kc, float& a0, float& a1) {
    const uint32_t t = prmt(sw, 0u, (kc & 1) ? 0x4342u : 0x4140u) << 7;
    const __half2 h = *reinterpret_cast<const __half2*>(&t);
    a0 = __low2float(h);
    a1 = __high2float(h);
}
#endif

// One chunk of MV_R rows against MV_M quantized x rows.  Per row, token and plane (h, then l):
// the integer dots of the chunk's halves (values 0-15, 16-31; Q8_0: the 16 values), the code
// offset removed through the dp4a seed (-offset * code sum, exact), then in this order
//   TWO_SCALES: acc += dot_lo * (a0 * s); acc += dot_hi * (a1 * s)
//   otherwise:  acc += (dot_lo + dot_hi) * (a0 * s); HAS_MIN: acc += sum32 * (b * s)
// with s the plane's scale (a * s is exact), each an FMA, the same for every MV_M.
// A8_JOIN, NVFP4, per row, token and half: D = 256 * dot_h + dot_l by one dp4a chain (the h
// chain's result times 256 plus the record's seed seeds the l chain), then acc += float(D) *
// (a * s), s = 2^(e-1), a = E4M3 * 2^-8 (the 8 and the 2^7 of ue4m3 / 2 in s); float(D) exact
// (I2F).  Q4_K: D over the whole chunk (halves as two chains, then added), acc += float(D) *
// (a * 2^(e-8)); acc += b * xsum (the record's exact block sum).
BW24_DEVICE void chunk_dot_a8(const Raw (&raw)[MV_R], int kc, int nck, const uint32_t* xw, int wpm, const uint4* meta, int nb,
                              uint32_t nv_t0, float (&acc)[MV_M][MV_R]) {
    float a0[MV_R], a1[MV_R], b[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; ++r) chunk_scales(raw[r], kc, a0[r], a1[r], b[r]);
#if FMT != F_NVFP4
    (void)nv_t0;
#endif
#if FMT == F_Q8_0
    (void)nck; (void)a1; (void)b;
#pragma unroll
    for (int m = 0; m < MV_M; ++m)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xw + (2 * m + p) * wpm + 4 * kc);
            const float dx = __uint_as_float(meta[(2 * m + p) * nb + (kc >> 1)].x);
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                int s = dp4a_s8(raw[r].q.x, xv.x, 0);
                s = dp4a_s8(raw[r].q.y, xv.y, s);
                s = dp4a_s8(raw[r].q.z, xv.z, s);
                s = dp4a_s8(raw[r].q.w, xv.w, s);
                acc[m][r] = __fmaf_rn(small_int_float(s), __fmul_rn(a0[r], dx), acc[m][r]);
            }
        }
#elif A8_JOIN  // NVFP4, Q4_K
    uint32_t cl[MV_R][4], ch[MV_R][4];
#if FMT == F_NVFP4
    (void)a0; (void)a1; (void)b;
    float s0[MV_R], s1[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; ++r) {
        nvfp4_scales_f16(raw[r].s.x, kc, s0[r], s1[r]);
#pragma unroll
        for (int g = 0; g < 4; ++g) nvfp4_weight_bytes(word_of(raw[r].q, g), nv_t0, cl[r][g], ch[r][g]);
    }
#else
    (void)a1;
#pragma unroll
    for (int r = 0; r < MV_R; ++r)
#pragma unroll
        for (int g = 0; g < 4; ++g) qwords(raw[r], g, cl[r][g], ch[r][g]);
#endif
#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
        const uint32_t* xh = xw + 2 * m * wpm;  // plane h; plane l at + wpm
        const uint4 hl = *reinterpret_cast<const uint4*>(xh + 4 * kc);
        const uint4 hh = *reinterpret_cast<const uint4*>(xh + 4 * (nck + kc));
        const uint4 ll = *reinterpret_cast<const uint4*>(xh + wpm + 4 * kc);
        const uint4 lh = *reinterpret_cast<const uint4*>(xh + wpm + 4 * (nck + kc));
        const uint4 mt = meta[2 * m * nb + kc];
        const float dx = __uint_as_float(mt.x);
        // the weight bytes' offset (NVFP4: 128) removed through the l chains' seeds; Q4_K has none
        const int seed_lo = FMT == F_NVFP4 ? (int)mt.y : 0, seed_hi = FMT == F_NVFP4 ? (int)mt.z : 0;
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
            // per half (values 0-15: il, 16-31: ih): the h chain, then the l chain seeded with it * 256
            int il = dp4a_u8(cl[r][0], hl.x, 0), ih = dp4a_u8(ch[r][0], hh.x, 0);
            il = dp4a_u8(cl[r][1], hl.y, il);
            ih = dp4a_u8(ch[r][1], hh.y, ih);
            il = dp4a_u8(cl[r][2], hl.z, il);
            ih = dp4a_u8(ch[r][2], hh.z, ih);
            il = dp4a_u8(cl[r][3], hl.w, il);
            ih = dp4a_u8(ch[r][3], hh.w, ih);
            il = dp4a_u8(cl[r][0], ll.x, il * 256 + seed_lo);
            ih = dp4a_u8(ch[r][0], lh.x, ih * 256 + seed_hi);
            il = dp4a_u8(cl[r][1], ll.y, il);
            ih = dp4a_u8(ch[r][1], lh.y, ih);
            il = dp4a_u8(cl[r][2], ll.z, il);
            ih = dp4a_u8(ch[r][2], lh.z, ih);
            il = dp4a_u8(cl[r][3], ll.w, il);
            ih = dp4a_u8(ch[r][3], lh.w, ih);
#if FMT == F_NVFP4
            acc[m][r] = __fmaf_rn(__int2float_rn(il), __fmul_rn(s0[r], dx), acc[m][r]);
            acc[m][r] = __fmaf_rn(__int2float_rn(ih), __fmul_rn(s1[r], dx), acc[m][r]);
#else
            acc[m][r] = __fmaf_rn(__int2float_rn(il + ih), __fmul_rn(a0[r], dx), acc[m][r]);
            acc[m][r] = __fmaf_rn(b[r], __uint_as_float(mt.w), acc[m][r]);  // the record's exact x sum
#endif
        }
    }
#else
    uint32_t cl[MV_R][4], ch[MV_R][4];
#pragma unroll
    for (int r = 0; r < MV_R; ++r)
#pragma unroll
        for (int g = 0; g < 4; ++g) qwords(raw[r], g, cl[r][g], ch[r][g]);
#pragma unroll
    for (int m = 0; m < MV_M; ++m)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint32_t* xp = xw + (2 * m + p) * wpm;
            const uint4 xl = *reinterpret_cast<const uint4*>(xp + 4 * kc);
            const uint4 xh = *reinterpret_cast<const uint4*>(xp + 4 * (nck + kc));
            const uint4 mt = meta[(2 * m + p) * nb + kc];
            const float dx = __uint_as_float(mt.x);
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                int il = -A8_OFF * (int)mt.y, ih = -A8_OFF * (int)mt.z;
                il = dp4a_u8(cl[r][0], xl.x, il);
                il = dp4a_u8(cl[r][1], xl.y, il);
                il = dp4a_u8(cl[r][2], xl.z, il);
                il = dp4a_u8(cl[r][3], xl.w, il);
                ih = dp4a_u8(ch[r][0], xh.x, ih);
                ih = dp4a_u8(ch[r][1], xh.y, ih);
                ih = dp4a_u8(ch[r][2], xh.z, ih);
                ih = dp4a_u8(ch[r][3], xh.w, ih);
#if TWO_SCALES
                acc[m][r] = __fmaf_rn(small_int_float(il), __fmul_rn(a0[r], dx), acc[m][r]);
                acc[m][r] = __fmaf_rn(small_int_float(ih), __fmul_rn(a1[r], dx), acc[m][r]);
#else
                acc[m][r] = __fmaf_rn(small_int_float(il + ih), __fmul_rn(a0[r], dx), acc[m][r]);
#if HAS_MIN
                acc[m][r] = __fmaf_rn(small_int_float((int)mt.w), __fmul_rn(b[r], dx), acc[m][r]);
#endif
#endif
            }
        }
#endif
}
#endif

#ifndef MV_ABLATE  // timing diagnostics only (bench/matvec_variants.py, BW24CHAT_MV_ABLATE), results are garbage:
#define MV_ABLATE 0  // bit 0: no prologue (x not staged), bit 1: no dot products (each chunk folded by one XOR)
#endif
#if ACT_Q8
// the integer-dot chunk product, or under MV_ABLATE bit 1 a fold that keeps the loads alive
BW24_DEVICE void dot_a8_or_ablated(const Raw (&cur)[MV_R], int kc, int nck, const uint32_t* xw, int wpm, const uint4* meta,
                                   int nb, uint32_t nv_t0, float (&acc)[MV_M][MV_R]) {
#if MV_ABLATE & 2
    (void)kc; (void)nck; (void)xw; (void)wpm; (void)meta; (void)nb; (void)nv_t0;
#pragma unroll
    for (int r = 0; r < MV_R; ++r)
        acc[0][r] = __uint_as_float(__float_as_uint(acc[0][r]) ^ cur[r].q.x ^ cur[r].q.y ^ cur[r].q.z ^ cur[r].q.w);
#else
    chunk_dot_a8(cur, kc, nck, xw, wpm, meta, nb, nv_t0, acc);
#endif
}
#endif

#ifndef MV_ROWPTR  // 1 (opt-in, cuda_linear BW24CHAT_MV_ROWPTR=1; not yet run on a GPU): the steady
#define MV_ROWPTR 0      // windows load through this warp's rows as plane pointers (formats.cuh
#endif                   // row_planes, set per tile), one IMAD.WIDE per load instead of the 64-bit
// row * nck + kc index's sign extension, add and LEA / LEA.HI.X: the steady window loop of the
// Qwen3-8B shapes (nvdisasm, twenty-third session) NVFP4 qkv / o / gate|up / down / LM head
// 515 / 707 / 682 / 1032 / 672 -> 502 / 689 / 634 / 1000 / 621 instructions, Q4_K gate|up 681 ->
// 635, Q8_0 gate|up 399 -> 262, LM head 317 -> 265; registers within +-1, no spills.  The same
// loads in the same order: the same bits.  Builds without steady windows keep the index (there
// the pointers cost a copy of the window's registers per guarded refill: Q4_K's o 473 -> 518).

#ifndef MV_NOCOPY  // 1 (opt-in, cuda_linear BW24CHAT_MV_NOCOPY=1; not yet run on a GPU): each slot's
#define MV_NOCOPY 0    // chunks consumed in place and the slot refilled after (consume), instead of
#endif                 // copied out and refilled first, with one slot more (MV_SLOTS = MV_U + 1): the
// same loads in flight during each window's dot products (MV_U) and the same registers, without
// the copy — ptxas kept the copy as register moves (the window loop's instructions per dp4a,
// nvdisasm, with MV_ROWPTR: NVFP4 o 5.38 -> 4.76, down 5.21 -> 4.81, Q4_K down 5.02 -> 4.34, Q8_0
// o / down 4.53 -> 3.66).  The one-slot steady builds take MV_PINGPONG instead (the same idea as
// pairs: 4.53 vs 4.64 for NVFP4's gate|up).
#if MV_NOCOPY
#define MV_SLOTS (MV_U + 1)
#else
#define MV_SLOTS MV_U
#endif

#ifndef MV_PINGPONG  // 1 (opt-in, cuda_linear BW24CHAT_MV_PINGPONG=1; one-slot steady builds only; not
#define MV_PINGPONG 0    // yet run on a GPU): the window loop in pairs with two chunk buffers that swap
#endif                   // roles, instead of each window copying its slot to a consumption buffer
// before the refill (ptxas keeps the loop-carried slot in fixed registers: ~20 moves per window of
// 4 rows in the one-slot builds, nvdisasm).  See the loop.
#if MV_PINGPONG && !(MV_U == 1 && MV_STEADY)
#error "MV_PINGPONG: one load slot and steady windows (MV_U 1, MV_STEADY 1)"
#endif
#if MV_NOCOPY && MV_PINGPONG
#error "MV_NOCOPY and MV_PINGPONG: one or the other"
#endif

#ifndef MV_L2AHEAD  // weights asked of L2 ahead of the loads (opt-in, cuda_linear BW24CHAT_MV_L2AHEAD,
// BW24CHAT_MV_L2AHEAD_O for the square <= 4096-row matrices only).  1: before pdl_wait every thread asks
// L2 for 128-byte lines of the block's first tile (every plane: codes, scales, high bits), so the
// DRAM streams it while the previous kernel's tail and this kernel's x prologue run (the register
// window holds ~37 KB per SM, the DRAM sits idle otherwise: the qkv's 14 MB fit in one such
// request wave); 2: also one tile ahead (the first two tiles before pdl_wait, then entering tile t
// the tile after it), so a block's demand loads hit lines the DRAM fetched while it computed the
// tile before.  A hint (prefetch.global.L2 writes no register and no result): the values and the
// bits are those of MV_L2AHEAD 0.  Unlike the eighth session's MV_L2PF (lost: each tile asked at
// its own start, racing its demand loads, on top of the shared-memory prologue), the lines asked
// here are not yet demanded.  Measured (twenty-second session, H100, matvec_variants NVFP4, us,
// 0 / 1 / 2): qkv 8.3 / 9.6 / 9.7, o 7.2 / **6.6** / 6.8, gate|up 23.6 / 24.8 / 26.8, down 14.6 /
// 16.4 / 16.3, LM head 42.2 / 43.3 / 50.3; decode with 2 everywhere 401.1 vs 447.2 tok/s — the third
// L2-prefetch design that loses, except on the o projection (its step neighbour, the attention,
// leaves most SMs and the DRAM idle): that one is the open experiment (stage s23).
#define MV_L2AHEAD 0
#endif
// the bytes [begin, end) of one plane asked of L2, 128-byte lines spread over the block's threads
BW24_DEVICE void l2_ahead_range(const void* begin, const void* end) {
    const char* p = static_cast<const char*>(begin);
    const long len = static_cast<const char*>(end) - p;
    for (long b = (long)threadIdx.x * 128; b < len; b += (long)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
    if (threadIdx.x == 0 && len > 0)  // the line holding the last byte (the range need not start on a line)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + len - 1));
}
// every plane of rows [row0, row0 + nrows) of the tile: each plane is row-major, so the rows are
// the bytes from row row0's planes (formats.cuh row_planes) to row row0 + nrows's
BW24_DEVICE void l2_ahead_tile(const uint4* wq, const void* wh, const void* ws, const void* wd, long row0, int nrows, int nck) {
    const RowPlanes a = row_planes(wq, wh, ws, wd, row0, nck), b = row_planes(wq, wh, ws, wd, row0 + nrows, nck);
    l2_ahead_range(a.q, b.q);
    if (a.h) l2_ahead_range(a.h, b.h);  // the formats without a plane have nullptr there (compile-time)
    if (a.s) l2_ahead_range(a.s, b.s);
    if (a.d) l2_ahead_range(a.d, b.d);
}

// Persistent tiles (as matvec_tc): block b takes the 8*MV_R-row tiles b, b + gridDim.x, ...
// (cuda_linear sizes the grid to the resident capacity with the same tile count per block).  The
// rmsnorm statistic is computed once per block and, when x fits (tk >= n_in, "resident"), so is
// the staged x; otherwise every tile re-stages each k-tile.  Loads run in a rolling window:
// chunk slot u (= i % MV_U for the lane's i-th chunk of the k-tile) is refilled with chunk
// i + MV_U as soon as chunk i is consumed, and the next tile's first chunks go out before this
// tile's epilogue.  A row's value does not depend on the block that computes it.
extern "C" __global__ void __launch_bounds__(MV_NT, MV_MINB)
matvec(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
       const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
       float* __restrict__ out, const float* __restrict__ normw, int n_out, int n_in, int ldx, int tk,
       int pro, int epi, float eps, const uint32_t* __restrict__ qx_in, uint32_t* __restrict__ qx_out) {
    extern __shared__ float4 smem4[];
#if ACT_Q8  // tk = n_in (x always resident)
    uint32_t* xw = reinterpret_cast<uint32_t*>(smem4);                      // [MV_M][2][n_in/4] code words
    uint4* meta = reinterpret_cast<uint4*>(xw + 2 * MV_M * (n_in / 4));     // [MV_M][2][n_in/32] block records
    float* red = reinterpret_cast<float*>(meta + 2 * MV_M * (n_in / 32));   // [MV_M][MV_NW]
    float* qxs = red + MV_M * MV_NW;                                        // [QX_BUFS][MV_M][32] qx_out's tile outputs
#else
    float* xs = reinterpret_cast<float*>(smem4);  // [MV_M][tk], swizzled
    float* xsum = xs + MV_M * tk;                 // [MV_M][tk/32]
    float* red = xsum + MV_M * (tk / 32);         // [MV_M][MV_NW]
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool xb16 = (pro & PRO_BF16) != 0;
    pro &= ~PRO_BF16;
    const int nck = n_in / VPC;
    const int ntiles = (n_out + MV_NW * MV_R - 1) / (MV_NW * MV_R);
    const bool resident = tk >= n_in;
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    long row0 = ((long)tile * MV_NW + warp) * MV_R;

    // The first batch of weight loads goes out before the prologue: its memory latency then
    // overlaps the prologue's x reads, reduction and staging instead of following them (the
    // small projections are a few microseconds long, so this start-up is a large share).
    Raw raw[MV_SLOTS][MV_R];
    RowPlanes rp[MV_R];  // MV_ROWPTR (steady builds): this warp's rows of the current tile (see MV_ROWPTR)
    auto aim = [&]() {
#pragma unroll
        for (int r = 0; r < MV_R; ++r) rp[r] = row_planes(wq, wh, ws, wd, min(row0 + r, (long)n_out - 1), nck);
    };
    aim();
    // chunk kc of this warp's row r (of the current tile) into c
    auto fetch_row = [&](Raw& c, int r, int kc) {
        if (MV_ROWPTR && MV_STEADY)
            fetch_chunk_at(c, rp[r], kc);
        else
            fetch_chunk(c, wq, wh, ws, wd, min(row0 + r, (long)n_out - 1), nck, kc);
    };
    auto fetch = [&](int u, int kk, int kcb, int nkc) {
        if (kk < nkc)
#pragma unroll
            for (int r = 0; r < MV_R; ++r) fetch_row(raw[u][r], r, kcb + kk);
    };
    const int nkc_first = min(tk, n_in) / VPC;
#pragma unroll
    for (int u = 0; u < MV_SLOTS; ++u) fetch(u, lane + 32 * u, 0, nkc_first);
    const int tile_rows = MV_NW * MV_R;
    auto l2_ahead = [&](int t) {  // MV_L2AHEAD: the rows of tile t (if it is this block's)
        if (t < ntiles)
            l2_ahead_tile(wq, wh, ws, wd, (long)t * tile_rows, min(tile_rows, n_out - t * tile_rows), nck);
    };
    if (MV_L2AHEAD >= 1) l2_ahead(tile);
    if (MV_L2AHEAD >= 2) l2_ahead(tile + (int)gridDim.x);
    pdl_wait();  // x (and out, for the add epilogue) come from the previous kernel

#if ACT_Q8
    if (pro == PRO_QX)
        stage_qx(qx_in, n_in, xw, meta);
    else if (!(MV_ABLATE & 1))
        stage_a8(x, ldx, n_in, pro, eps, normw, xb16, xw, meta, red);
    __syncthreads();
    // NVFP4's table word in a vector register (nvfp4_weight_bytes): a constant, or a shuffle of
    // one from lane 0, went to a uniform register and was copied back before every PRMT; a
    // lane-indexed shuffle's result is not provably uniform
    const uint32_t nv_t0 = __shfl_sync(0xffffffffu, 0x03020100u + (uint32_t)lane, lane) - (uint32_t)lane;
#else
    float inv[MV_M];
    // 16-byte x reads where the rows allow them (the same values either way: load_group)
    const bool vec = ((reinterpret_cast<unsigned long long>(x) | (pro == PRO_RMS ? reinterpret_cast<unsigned long long>(normw) : 0ull)) & 15) == 0
                     && (ldx & 3) == 0 && (n_in & 3) == 0;
    rms_inv_rows(x, ldx, n_in, pro, eps, vec, red, inv);
    (void)qx_in; (void)qx_out;
#endif
    for (bool staged = ACT_Q8;;) {
        float acc[MV_M][MV_R];
#pragma unroll
        for (int m = 0; m < MV_M; ++m)
#pragma unroll
            for (int r = 0; r < MV_R; ++r) acc[m][r] = 0.0f;

        for (int k0 = 0; k0 < n_in; k0 += tk) {
            const int tkk = min(tk, n_in - k0);
            const int nkc = tkk / VPC, kcb = k0 / VPC;
#if ACT_Q8
            (void)staged; (void)resident;
#else
            if (!(resident && staged)) {
                __syncthreads();  // the previous tile (and red[]) is consumed
                stage_float_x(x, ldx, n_in, k0, tkk, tk, pro, inv, normw, vec, xb16, xs);
#if HAS_MIN
                __syncthreads();
                for (int c = tid; c < MV_M * (tk / 32); c += MV_NT) {
                    const int m = c / (tk / 32), cl = c - m * (tk / 32);
                    if (cl * 32 < tkk) {
                        const float* b = xs + m * tk + (cl >> 5) * WT + 4 * (cl & 31);
                        float s = b[0];
#pragma unroll
                        for (int e = 1; e < 32; ++e) s = __fadd_rn(s, b[(e >> 2) * 128 + (e & 3)]);
                        xsum[c] = s;
                    }
                }
#endif
                __syncthreads();
                staged = true;
            }
#endif
            if (k0 != 0) {  // a later k-tile: its first window (the first was fetched ahead)
#pragma unroll
                for (int u = 0; u < MV_SLOTS; ++u) fetch(u, lane + 32 * u, kcb, nkc);
            }
            // chunk kk of every row of this warp into c, no guard (the steady windows')
            auto fetch_rows = [&](Raw (&c)[MV_R], int kk) {
#pragma unroll
                for (int r = 0; r < MV_R; ++r) fetch_row(c[r], r, kcb + kk);
            };
            // the dot products of window i (this lane: chunk lane + 32 i of the k-tile) on the chunks c
            auto dot_window = [&](const Raw (&c)[MV_R], int i) {
                const int kk = lane + 32 * i;
#if ACT_Q8
                dot_a8_or_ablated(c, kk, nck, xw, n_in / 4, meta, n_in / 32, nv_t0, acc);
#else
                chunk_dot(c, kcb + kk, xs + i * WT + 4 * lane, tk, xsum + kk, tk / 32, acc);
#endif
            };
            // slot u of window i0: consume chunk kk (this lane's (i0+u)-th of the k-tile), refill
            // the slot with chunk kk + 32*MV_SLOTS; `steady`: every refill exists (no guard)
            auto consume = [&](int u, int i0, bool steady) {
                const int kk = lane + 32 * (i0 + u);
                if (MV_NOCOPY) {  // the slot's chunks consumed in place, then the slot refilled
                    dot_window(raw[u], i0 + u);
                    if (steady)
                        fetch_rows(raw[u], kk + 32 * MV_SLOTS);
                    else
                        fetch(u, kk + 32 * MV_SLOTS, kcb, nkc);
                    return;
                }
                Raw cur[MV_R];
#pragma unroll
                for (int r = 0; r < MV_R; ++r) cur[r] = raw[u][r];
                if (steady)
                    fetch_rows(raw[u], kk + 32 * MV_SLOTS);
                else
                    fetch(u, kk + 32 * MV_SLOTS, kcb, nkc);  // refill the slot (none past the k-tile)
                dot_window(cur, i0 + u);
            };
            int i0 = 0;
#if MV_PINGPONG
            // One slot, windows in pairs: window i0's chunks (raw[0]) are consumed while window
            // i0 + 1's load into nxt, then i0 + 1's while i0 + 2's load into raw[0] — the two
            // buffers swap roles in code, so no window copies its chunks to a consumption buffer
            // (consume's cur, ~20 register moves per window: MV_PINGPONG's definition).  The same
            // loads and dot products in the same order as the slot loop below.
            for (; (i0 + 3) * 32 <= nkc; i0 += 2) {
                Raw nxt[MV_R];
                fetch_rows(nxt, lane + 32 * (i0 + 1));
                dot_window(raw[0], i0);
                fetch_rows(raw[0], lane + 32 * (i0 + 2));
                dot_window(nxt, i0 + 1);
            }
            if ((i0 + 2) * 32 == nkc) {  // the k-tile's last pair, whole for every lane: nothing after it to load
                Raw nxt[MV_R];
                fetch_rows(nxt, lane + 32 * (i0 + 1));
                dot_window(raw[0], i0);
                dot_window(nxt, i0 + 1);
                i0 += 2;
            }
#endif
            for (; i0 * 32 < nkc; i0 += MV_SLOTS) {
                // MV_STEADY: while every chunk of the window and every refill exist for all lanes,
                // the window is one branch-free block, so one slot's shared-memory x reads overlap
                // the previous slot's dot products (Nsight Compute: the int-dot matvec waited on
                // shared memory 50-57 % of its stall cycles; measured -5..-14 % per Q8_0 / Q4_K
                // matvec, bench/NOTES.md seventh session).  Same operations, same order.
                if (MV_STEADY && (i0 + 2 * MV_SLOTS) * 32 <= nkc) {
#pragma unroll
                    for (int u = 0; u < MV_SLOTS; ++u) consume(u, i0, true);
                    continue;
                }
#pragma unroll
                for (int u = 0; u < MV_SLOTS; ++u)
                    if (lane + 32 * (i0 + u) < nkc) consume(u, i0, false);
            }
        }

        // the next tile's first window goes out before this tile's reduction and stores
        const long this_row0 = row0;
        const int this_tile = tile;
        tile += gridDim.x;
        if (tile < ntiles) {
            row0 = ((long)tile * MV_NW + warp) * MV_R;
            aim();
#pragma unroll
            for (int u = 0; u < MV_SLOTS; ++u) fetch(u, lane + 32 * u, 0, nkc_first);
            if (MV_L2AHEAD >= 2) l2_ahead(tile + (int)gridDim.x);  // one tile ahead of the one starting
        } else {
            pdl_trigger();  // this block's weight stream is done: the next kernel may start its loads
        }
#if ACT_Q8
        // qx_out's tile buffer: the tile ordinal's parity (QX_HANDOFF >= 1)
        const int tord = (this_tile - (int)blockIdx.x) / (int)gridDim.x, my_tiles = (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
        float* qxb = qxs + (QX_HANDOFF ? (tord & 1) * MV_M * 32 : 0);
        // the quantizing warp of this tile, and of tile tord - 2 (QX_ROTATE; else warp 0)
        const int qw = QX_ROTATE ? tord % MV_NW : 0, qw2 = QX_ROTATE ? (tord + MV_NW - 2) % MV_NW : 0;
        if (QX_HANDOFF == 2 && qx_out && epi == EPI_SWIGLU && warp != qw2 && tord >= 2)
            named_bar_sync(QX_BAR_EMPTY + (tord & 1), MV_NT);  // warp qw2 has read this buffer (tile tord - 2)
#endif
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            float v[MV_R];
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                v[r] = warp_sum(acc[m][r]);
                if (gscale && this_row0 + r < n_out) v[r] = __fmul_rn(v[r], gscale[this_row0 + r]);
            }
            if (lane != 0) continue;
            if (epi == EPI_SWIGLU) {  // rows (2i, 2i+1) = (gate_i, up_i) -> out[m, i], row stride n_out/2
#pragma unroll
                for (int r = 0; r + 1 < MV_R; r += 2)
                    if (this_row0 + r + 1 < n_out) {
                        const float a = swiglu_act(v[r], v[r + 1]);
                        out[(long)m * (n_out >> 1) + ((this_row0 + r) >> 1)] = a;
#if ACT_Q8
                        if (qx_out) qxb[m * 32 + ((warp * MV_R + r) >> 1)] = xb16 ? bf16_round(a) : a;
#endif
                    }
            } else {
#pragma unroll
                for (int r = 0; r < MV_R; ++r) {
                    const long o = this_row0 + r;
                    if (o < n_out) {
                        float* dst = out + (long)m * n_out + o;
                        *dst = epi == EPI_ADD ? __fadd_rn(*dst, v[r]) : v[r];
                    }
                }
            }
        }
#if ACT_Q8
        // The tile's 32 outputs (MV_NW * MV_R = 64 rows: the wrapper checks) are block this_tile of
        // the next matvec's x: warp qw quantizes them once every warp's are in (QX_HANDOFF above).
        // (A hand-off where the tile's last warp to arrive quantizes, found by a shared-memory
        // arrival count and a spin, measured slower: NVFP4 tg128@512 415.5 vs 422.0; NOTES.md.)
        if (qx_out && epi == EPI_SWIGLU) {
            const int nq = n_out >> 1;
            if (QX_HANDOFF == 2 && warp != qw)
                named_bar_arrive(QX_BAR_FULL + (tord & 1), MV_NT);  // this warp's outputs are in: go on
            else if (QX_HANDOFF == 2)
                named_bar_sync(QX_BAR_FULL + (tord & 1), MV_NT);
            else
                __syncthreads();
            if (warp == qw) {
                for (int m0 = 0; m0 < MV_M; m0 += 4) {  // lane group lane / 8: token m0 + lane / 8
                    const int m = m0 + (lane >> 3);
                    const float4 v = m < MV_M ? reinterpret_cast<const float4*>(qxb + m * 32)[lane & 7] : make_float4(0.f, 0.f, 0.f, 0.f);
                    qx_write_block(qx_out + (long)min(m, MV_M - 1) * qx_row_words(nq), nq, this_tile, v, m < MV_M);
                }
                if (QX_HANDOFF == 2 && tord + 2 < my_tiles) {
                    __syncwarp();  // every lane's reads of the buffer are done
                    named_bar_arrive(QX_BAR_EMPTY + (tord & 1), MV_NT);
                }
            }
            if (QX_HANDOFF == 0) __syncthreads();  // qxs is the next tile's
        }
        (void)my_tiles;
#else
        (void)this_tile;
#endif
        if (tile >= ntiles) break;
    }
}

// =====================================================================================
// matvec_tc — NVFP4 decode on tensor cores (same contract as matvec; selected by the wrapper
// for NVFP4 weights).  The SIMT kernel above spends ~6 instructions per weight turning E2M1
// codes into floats (measured instruction-bound at ~20 % of the copy bandwidth, H200 profile in
// bench/NOTES.md); here the tensor cores do the multiply-adds and a code costs ~2 instructions.
//
// Math.  Per row o and NVFP4 block b (16 values): A[o, k] = E2M1(code) * E4M3(scale_b), an exact
// f16 number (<= 5 significant bits, 2^-10 <= |A| <= 2880 or 0); the activations, after the
// prologue, per token m: x' = x * 2^s_m (s_m = 13 - floor(log2(a_m)), a_m within 2 ulps of
// max_k |x[m, k]| (tc_stats), so max |x'| < 2^14 < the f16 maximum; exact), split
// x' = hi + lo with hi = f16(x'), lo = f16(x' - hi) (x' - hi exact in f32).  Then
//   y[m, o] = gs[o] * 2^-s_m * sum over k-steps of (A . hi + A . lo)   (f32 tensor-core accumulate)
// — the f16 products are exact and the x rounding left is ~2^-22 relative, as the SIMT path.
// Codes: E2M1 (s e1 e0 m) becomes the E4M3 byte s<<7 | (e1 e0 m)<<2 = E2M1 * 2^-6 exactly (e = 0
// lands on E4M3 subnormals: m * 2^-7), four codes per word with two shifts and two masks; then
// cvt.rn.f16x2.e4m3x2 (sm_89+) and one HMUL2 by the block scale as f16 (E4M3 bits << 7 =
// E4M3 * 2^-8, times 2^14: exact).
// MMA k-slot order.  mma.m16n8k16 (row.col): lane (g = lane/4, t = lane%4) holds A rows g and
// g+8 at k-slots {2t, 2t+1, 2t+8, 2t+9} and B column (token) g at the same slots.  A "super-step"
// covers 4 chunks (128 values) of the row: lane t reads chunk cb+t of rows g and g+8 (16-byte
// loads, 64 contiguous bytes per row across the 4 lanes), and k-step (h, wi), h = 0..1 (low /
// high half of the selector word = block 2c / 2c+1), wi = 0..3 (word), puts values 16h+4wi+{0,1} of its chunk in
// slots 2t+{0,1} and +{2,3} in 2t+8+{0,1}.  So one MMA mixes 4 blocks of different scales: A is
// pre-scaled (above).  B is staged once per block in shared memory in the same order: per token
// and 4 positions, a uint4 {hi(p0,p1), hi(p2,p3), lo(p0,p1), lo(p2,p3)}.
// Order (exactness): warp w takes the super-steps ss = w, w + TC_NW, ... in increasing order, each
// k-step's MMA A.hi then A.lo into one accumulator chain; the TC_NW warps' partial sums are added
// in warp order.  Nothing depends on MV_M (the x k-tile size does, but not the order), and an MMA's
// column (token) j depends only on A and B column j: rows are bit-identical for m = 1..8.
// Geometry: 32-row tiles (two 16-row MMA tiles sharing every B fragment), TC_NW warps per block;
// persistent: the grid is at most the resident capacity and each block loops over tiles
// (cuda_linear.persistent_grid).  The prologue statistics and x' staging were per tile (each of the
// 768 gate|up blocks re-read and re-reduced all of x in three scalar passes) and are per block
// now, in one float4 pass plus one in-place conversion.  Dynamic shared: MV_M * tkx * 4 (x,
// tkx a multiple of 4 * VPC * TC_NW * TC_U) + TC_NW KB + 8 * TC_NW + 8 * MV_M bytes.
// BF16 / F16 weights (same kernel): the 16-byte chunk holds 8 values in natural order, so a
// super-step covers 32 values of a row and has 2 k-steps; k-step ks puts values 4ks, 4ks+1 (word
// 2ks) in slots 2t, 2t+1 and 4ks+2, 4ks+3 (word 2ks+1) in 2t+8, 2t+9 — the A registers are the
// loaded words themselves, no decoding.  F16 uses the f16 MMA with the scaled f16 split above;
// BF16 the bf16 MMA with x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (no scaling: bf16 has the
// f32 exponent range), x rounding ~2^-17 relative — the precise prefill GEMM's split.  The SIMT
// kernel spent ~2 instructions per BF16 weight (unpack + FMA, plus the x reads from shared
// memory) and was issue-bound on the small projections (bench/NOTES.md, ncu).
#if FMT == F_NVFP4 || FMT == F_BF16 || FMT == F_F16
#define TC_KSTEPS (VPC / 4)  // k-steps per super-step: NVFP4 8 (h = ks / 4, wi = ks % 4), BF16/F16 2
#define TC_BF16 (FMT == F_BF16)
#ifndef TC_NW
#define TC_NW 4  // warps per block (split-K ways)
#endif
#define TC_ROWS 32
#ifndef TC_U
#define TC_U 2  // super-steps per lane in flight: TC_U x (2 tiles x 2 rows) 16-byte loads
#endif

BW24_DEVICE uint32_t e4m3x2_to_f16x2(uint32_t v16) {
    uint32_t d;
    asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(d) : "r"(v16));
    return d;
}

BW24_DEVICE uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
}

BW24_DEVICE void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

BW24_DEVICE void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

BW24_DEVICE void mma_tc(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if TC_BF16
    mma_bf16_16816(c, a0, a1, a2, a3, b0, b1);
#else
    mma_f16_16816(c, a0, a1, a2, a3, b0, b1);
#endif
}

// the two block scales of chunk c of a row (scale word sw) as f16x2 broadcast pairs, times 2^14
BW24_DEVICE void tc_scales(uint32_t sw, int c, uint32_t (&sc)[2]) {
    const uint32_t b2 = (sw >> (16 * (c & 1))) & 0xFFFFu;  // bytes: block 2c, block 2c+1
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t f = ((b2 >> (8 * h)) & 0xFFu) << 7;  // E4M3 * 2^-8 as f16 bits (repacked bytes: formats.cuh)
        const uint32_t f2 = hmul2_u32(f | (f << 16), 0x74007400u);  // * 2^14 (0x7400 = 16384)
        sc[h] = f2;
    }
}

// A fragment registers of one row for k-step (h, wi): (slots 2t,2t+1), (slots 2t+8, 2t+9).
// The four codes of half h of selector word wi (formats.cuh) spread to one per byte (low
// nibble), then each code's magnitude bits placed at E4M3 bits 2-4 and its sign at bit 7.
BW24_DEVICE void tc_afrag(const uint4& q, int h, int wi, uint32_t sc, uint32_t& lo_pair, uint32_t& hi_pair) {
    const uint32_t v = word_of(q, wi) >> (16 * h);
    const uint32_t w = __byte_perm(v & 0x0F0Fu, (v >> 4) & 0x0F0Fu, 0x5140u);  // byte j = code j
    const uint32_t e4 = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
    lo_pair = hmul2_u32(e4m3x2_to_f16x2(e4 & 0xFFFFu), sc);
    hi_pair = hmul2_u32(e4m3x2_to_f16x2(e4 >> 16), sc);
}

// A registers of one row for k-step ks of the chunk q (sc: NVFP4 block scales of the chunk)
BW24_DEVICE void tc_afrag_ks(const uint4& q, int ks, const uint32_t (&sc)[2], uint32_t& lo_pair, uint32_t& hi_pair) {
#if FMT == F_NVFP4
    tc_afrag(q, ks >> 2, ks & 3, sc[ks >> 2], lo_pair, hi_pair);
#else
    (void)sc;
    lo_pair = word_of(q, 2 * ks);
    hi_pair = word_of(q, 2 * ks + 1);
#endif
}

// Statistics of token m's prologue input, once per block (not per tile): ss = sum_k x^2 (rmsnorm:
// lanes take float4 groups tid, tid + NT, ... in order, then warp_sum, then warps in order) and
// am = max_k |x_k * w_k| (rmsnorm) or max_k |prologue(x)_k|; with resident x (tkx >= n_in) the
// raw values (rmsnorm) or the prologue's output (otherwise) are kept in xs as float4 for the
// staging pass, which touches only the slots its own thread wrote (no barrier between).
BW24_DEVICE void tc_stats(const float* __restrict__ x, const float* __restrict__ normw, float4* xraw, int m, int ldx,
                          int n_in, int pro, bool resident, float eps, float* stat, float* minv, float* mscale) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float4* x4 = reinterpret_cast<const float4*>(x + (long)m * ldx);
    const float4* w4 = reinterpret_cast<const float4*>(normw);
    float ss = 0.0f, am = 0.0f;
#pragma unroll 4
    for (int qi = tid; qi < n_in / 4; qi += TC_NW * 32) {
        float4 v = x4[qi];
        if (pro == PRO_RMS) {
            const float4 w = __ldg(w4 + qi);
            ss = __fmaf_rn(v.x, v.x, ss); ss = __fmaf_rn(v.y, v.y, ss);
            ss = __fmaf_rn(v.z, v.z, ss); ss = __fmaf_rn(v.w, v.w, ss);
            am = fmaxf(am, fmaxf(fmaxf(fabsf(v.x * w.x), fabsf(v.y * w.y)), fmaxf(fabsf(v.z * w.z), fabsf(v.w * w.w))));
        } else {
            if (pro == PRO_SWIGLU) {
                const float4 u = x4[n_in / 4 + qi];
                v = make_float4(swiglu_act(v.x, u.x), swiglu_act(v.y, u.y), swiglu_act(v.z, u.z), swiglu_act(v.w, u.w));
            }
            am = fmaxf(am, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
        if (resident) xraw[qi] = v;
    }
    ss = warp_sum(ss);
    am = warp_max(am);
    if (lane == 0) { stat[2 * warp] = ss; stat[2 * warp + 1] = am; }
    __syncthreads();
    if (tid == 0) {
        float s = stat[0], a = stat[1];
#pragma unroll
        for (int w = 1; w < TC_NW; ++w) { s = __fadd_rn(s, stat[2 * w]); a = fmaxf(a, stat[2 * w + 1]); }
        const float inv = pro == PRO_RMS ? rms_inv(s, n_in, eps) : 1.0f;
        a = __fmul_rn(a, inv);  // within 2 ulps of max |xin|
        // 2^(13 - floor(log2 a)): the largest |x'| lands below 2^14 (f16 max 65504), with room
        // for the rounding of the estimate; x' = x * 2^s is exact, so s only sets where the
        // hi/lo split lands, not the value
        const int e = a > 0.0f ? ((__float_as_uint(a) >> 23) & 0xFF) - 127 : 0;
        minv[m] = inv;
        mscale[m] = TC_BF16 ? 1.0f : __uint_as_float((uint32_t)(127 + 13 - max(-100, min(100, e))) << 23);
    }
    __syncthreads();
}

// four consecutive prologue outputs v -> x' = v * sc split into hi/lo (f16, or bf16 for BF16
// weights) as the staged uint4 {hi(0,1), hi(2,3), lo(0,1), lo(2,3)}
BW24_DEVICE uint4 tc_split4(float4 v, float sc) {
    v = make_float4(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc), __fmul_rn(v.z, sc), __fmul_rn(v.w, sc));
#if TC_BF16
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
    const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
    const __nv_bfloat162 l01 = __floats2bfloat162_rn(__fsub_rn(v.x, f01.x), __fsub_rn(v.y, f01.y));
    const __nv_bfloat162 l23 = __floats2bfloat162_rn(__fsub_rn(v.z, f23.x), __fsub_rn(v.w, f23.y));
#else
    const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
    const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
    const __half2 l01 = __floats2half2_rn(__fsub_rn(v.x, f01.x), __fsub_rn(v.y, f01.y));
    const __half2 l23 = __floats2half2_rn(__fsub_rn(v.z, f23.x), __fsub_rn(v.w, f23.y));
#endif
    uint4 o;
    o.x = *reinterpret_cast<const uint32_t*>(&h01);
    o.y = *reinterpret_cast<const uint32_t*>(&h23);
    o.z = *reinterpret_cast<const uint32_t*>(&l01);
    o.w = *reinterpret_cast<const uint32_t*>(&l23);
    return o;
}

// Persistent tiles: block b takes the 32-row tiles b, b + gridDim.x, ... (the wrapper sizes the
// grid to the resident capacity and evens out the tiles per block).  The prologue statistics
// and, when x fits (tkx >= n_in), the staged x' are computed once per block; the next tile's
// first weight loads go out before the current tile's cross-warp reduction.  A tile's values
// do not depend on which block computes it.
extern "C" __global__ void __launch_bounds__(TC_NW * 32)
matvec_tc(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
          const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
          float* __restrict__ out, const float* __restrict__ normw, int n_out, int n_in, int ldx, int tkx,
          int pro, int epi, float eps) {
    (void)wh; (void)wd;
    extern __shared__ float4 smem4[];
    uint4* xs = reinterpret_cast<uint4*>(smem4);                   // [MV_M][tkx/4]
    float* red = reinterpret_cast<float*>(xs + MV_M * (tkx / 4));  // [TC_NW][TC_ROWS][8] partial sums
    float* stat = red + TC_NW * TC_ROWS * 8;                       // [TC_NW][2] reductions
    float* minv = stat + 2 * TC_NW;                                // [MV_M] rms inverse
    float* mscale = minv + MV_M;                                   // [MV_M] 2^s_m
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool xb16 = (pro & PRO_BF16) != 0;  // x rounded to bf16 before the split (BF16: lo = 0, its MMAs still run)
    pro &= ~PRO_BF16;
    const int g = lane >> 2, t = lane & 3;
    const int nck = n_in / VPC;
    const int nss = (nck + 3) / 4;  // super-steps of 4 chunks (4 * VPC values of a row)
    const int ntiles = (n_out + TC_ROWS - 1) / TC_ROWS;
    const bool resident = tkx >= n_in;
#if FMT == F_NVFP4
    const unsigned int* ws32 = reinterpret_cast<const unsigned int*>(ws);
#else
    (void)ws;
#endif
    long rows[4];  // this lane's rows: tile 0 g, g+8; tile 1 g, g+8
    auto set_rows = [&](int tile) {
#pragma unroll
        for (int i = 0; i < 4; ++i) rows[i] = min((long)tile * TC_ROWS + 16 * (i >> 1) + g + 8 * (i & 1), (long)n_out - 1);
    };

    uint4 q[TC_U][4];
    uint32_t sw[TC_U][4];
    auto fetch = [&](int u, int ss) {
        const int c = ss * 4 + t;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (ss < nss && c < nck) {
                q[u][i] = ld_stream16(wq + rows[i] * nck + c);
#if FMT == F_NVFP4
                sw[u][i] = __ldg(ws32 + rows[i] * (nck >> 1) + (c >> 1));
#endif
            } else {
                q[u][i] = make_uint4(0u, 0u, 0u, 0u);  // codes / values 0: A = 0 (and x = 0 there)
                sw[u][i] = 0u;
            }
        }
    };
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    set_rows(tile);
    // the first super-steps' loads go out before the prologue (as in matvec)
#pragma unroll
    for (int u = 0; u < TC_U; ++u) fetch(u, warp + TC_NW * u);
    pdl_wait();  // x (and out, for the add epilogue) come from the previous kernel

    for (int m = 0; m < MV_M; ++m) {
        float4* xraw = reinterpret_cast<float4*>(xs + m * (tkx / 4));
        tc_stats(x, normw, xraw, m, ldx, n_in, pro, resident, eps, stat, minv, mscale);
        if (resident) {  // own slots only: the thread wrote exactly these in tc_stats
            const float inv = minv[m], sc = mscale[m];
            const float4* w4 = reinterpret_cast<const float4*>(normw);
            for (int qi = tid; qi < tkx / 4; qi += TC_NW * 32) {
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (qi < n_in / 4) {
                    v = xraw[qi];
                    if (pro == PRO_RMS) {
                        const float4 w = __ldg(w4 + qi);
                        v = make_float4(rms_apply(v.x, inv, w.x), rms_apply(v.y, inv, w.y),
                                        rms_apply(v.z, inv, w.z), rms_apply(v.w, inv, w.w));
                    }
                }
                if (xb16) v = bf16_round4(v);
                xs[m * (tkx / 4) + qi] = tc_split4(v, sc);
            }
        }
    }
    __syncthreads();

    const int ss_per_tile = tkx / (4 * VPC);  // a multiple of TC_NW * TC_U (tkx: a multiple of 4 * VPC * TC_NW * TC_U)
    for (;;) {
        float acc[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

        for (int k0 = 0, st0 = 0; k0 < n_in; k0 += tkx, st0 += ss_per_tile) {
            if (!resident) {  // ---- stage this k-tile of x' (x larger than the staging budget)
                __syncthreads();
                for (int m = 0; m < MV_M; ++m) {
                    const float inv = minv[m], sc = mscale[m];
                    for (int qi = tid; qi < tkx / 4; qi += TC_NW * 32) {
                        float v[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int p = k0 + 4 * qi + e;
                            v[e] = p < n_in ? prologue_x(x, (long)m * ldx, p, n_in, pro, inv, normw) : 0.0f;
                        }
                        float4 v4 = make_float4(v[0], v[1], v[2], v[3]);
                        if (xb16) v4 = bf16_round4(v4);
                        xs[m * (tkx / 4) + qi] = tc_split4(v4, sc);
                    }
                }
                __syncthreads();
            }
            // ---- this warp's super-steps of the k-tile, ss = warp + TC_NW * j in increasing order.
            // A rolling window: slot u = j % TC_U holds step j's weights; as soon as a step is
            // consumed its slot is refilled with step j + TC_U, so TC_U - 1..TC_U steps stay in
            // flight all the time (fetching all slots, then consuming all, drained the window to
            // zero before every refill).  st0 is a multiple of TC_NW * TC_U (tkx a multiple of
            // 4 * VPC * TC_NW * TC_U), so the slot of a step never depends on the k-tile.
            const int st1 = min(nss, st0 + ss_per_tile);
            for (int ssb = st0 + warp; ssb < st1; ssb += TC_NW * TC_U) {
#pragma unroll
                for (int u = 0; u < TC_U; ++u) {
                    const int s2 = ssb + TC_NW * u;
                    if (s2 >= st1) break;
                    const int c = s2 * 4 + t;
                    uint32_t sc[4][2] = {};
#if FMT == F_NVFP4
#pragma unroll
                    for (int i = 0; i < 4; ++i) tc_scales(sw[u][i], c, sc[i]);
#endif
                    uint4 qc[4];
#pragma unroll
                    for (int i = 0; i < 4; ++i) qc[i] = q[u][i];
                    fetch(u, s2 + TC_NW * TC_U);  // past nss: zero fill, no load
                    const int qbase = (c * VPC - k0) / 4;  // x group of the chunk's first value
#pragma unroll
                    for (int ks = 0; ks < TC_KSTEPS; ++ks) {
                        uint4 b = make_uint4(0u, 0u, 0u, 0u);
                        if (g < MV_M) b = xs[g * (tkx / 4) + qbase + ks];
                        uint32_t a[4][2];
#pragma unroll
                        for (int i = 0; i < 4; ++i) tc_afrag_ks(qc[i], ks, sc[i], a[i][0], a[i][1]);
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            // A regs: (row g, slots 2t..), (row g+8, 2t..), (row g, 2t+8..), (row g+8, 2t+8..)
                            mma_tc(acc[mt], a[2 * mt][0], a[2 * mt + 1][0], a[2 * mt][1], a[2 * mt + 1][1], b.x, b.y);
                            mma_tc(acc[mt], a[2 * mt][0], a[2 * mt + 1][0], a[2 * mt][1], a[2 * mt + 1][1], b.z, b.w);
                        }
                    }
                }
            }
        }

        // ---- the next tile's first loads go out now; they land during this tile's reduction
        const long row0 = (long)tile * TC_ROWS;
        tile += gridDim.x;
        if (tile < ntiles) {
            set_rows(tile);
#pragma unroll
            for (int u = 0; u < TC_U; ++u) fetch(u, warp + TC_NW * u);
        } else {
            pdl_trigger();  // this block's weight stream is done: the next kernel may start its loads
        }

        // ---- partial sums of the warps, added in warp order; epilogue
        __syncthreads();  // the previous tile's epilogue has read red[]
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int r = mt * 16 + g + 8 * (j >> 1), col = 2 * t + (j & 1);
                red[(warp * TC_ROWS + r) * 8 + col] = acc[mt][j];
            }
        __syncthreads();
        for (int i = tid; i < TC_ROWS * MV_M; i += TC_NW * 32) {
            const int r = i / MV_M, m = i - r * MV_M;
            const long o = row0 + r;
            float v = red[r * 8 + m];
#pragma unroll
            for (int w = 1; w < TC_NW; ++w) v = __fadd_rn(v, red[(w * TC_ROWS + r) * 8 + m]);
            v = __fdiv_rn(v, mscale[m]);  // exact: a power of two
            if (o < n_out && gscale) v = __fmul_rn(v, gscale[o]);
            red[r * 8 + m] = v;  // finished value, read back by the pair owner below
        }
        __syncthreads();
        for (int i = tid; i < TC_ROWS * MV_M; i += TC_NW * 32) {
            const int r = i / MV_M, m = i - r * MV_M;
            const long o = row0 + r;
            if (o >= n_out) continue;
            const float v = red[r * 8 + m];
            if (epi == EPI_SWIGLU) {
                if ((r & 1) == 0 && o + 1 < n_out) out[(long)m * (n_out >> 1) + (o >> 1)] = swiglu_act(v, red[(r + 1) * 8 + m]);
            } else {
                float* dst = out + (long)m * n_out + o;
                *dst = epi == EPI_ADD ? __fadd_rn(*dst, v) : v;
            }
        }
        if (tile >= ntiles) break;
    }
}
#endif
