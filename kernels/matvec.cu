// matvec.cu — the decode matvec (m = 1..8 tokens) on the repacked weights, SIMT: every format
// on the float contract, and the quantized formats on the integer-dot contract (ACT_Q8,
// matvec_a8.cuh, dot_a8.cuh).  matvec_tc.cu is the tensor-core kernel of NVFP4 (float contract) and F16;
// cuda_linear.matvec picks the kernel and its geometry.
//
// Napkin math (Qwen3-8B, m = 1, H100 SXM 3.35 TB/s): the weight matrix is read once per launch
// and each weight feeds 2 FLOPs per token, ~0.5-4 FLOP/byte (BF16 2 bytes per weight, Q8_0 1.06,
// Q4_K / NVFP4 0.56), far below any ridge point: the kernel aims at the DRAM roofline, weight
// bytes / bandwidth — Q4_K o 4096 x 4096 = 9.4 MB -> 2.8 us, gate|up 24576 x 4096 = 57 MB -> 17
// us, BF16 LM head 49152 x 4096 = 403 MB -> 120 us.  What keeps it off that floor on the small
// matrices is the loads in flight per SM (the rolling window below) and the prologue (every
// block stages all of x); on the quantized formats the instructions per weight (decoding, dp4a).
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
//   block re-quantizing all F inputs (the prologues took ~21 % of an NVFP4 decode step,
//   docs/performance.md).  QX layout per token m (uint32 words, n = the inputs, row
//   stride qx_row_words(n) = 5n/8): [0, n/4) h codes, [n/4, n/2) l codes (natural order, 4 int8
//   per word), then n/32 int4 records {e, sum h of inputs 0-15, of 16-31, sum l of 0-15 | (sum l of
//   16-31) << 16} (kernel_refs.qx_ref is the NumPy mirror).
//   NumPy reference: kernel_refs.matvec_ref (xin @ W.T, W = QTensor.dequantize()).
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
// of x in natural order; Q2_K per half: a0*dot_lo, a1*dot_hi, b0*xsum_lo, b1*xsum_hi) — all explicit __fmaf_rn/__fadd_rn; then warp_sum (fixed xor tree).
// So row m of an MV_M=8 call equals the MV_M=1 call on that row bit for bit.  Float formats
// (F32/F16/BF16) do acc = fma(w, x, acc) value by value.  Weights are decoded exactly (the
// scale factored out of the chunk dot: a*sum(q*x) instead of sum((a*q)*x), a rounding
// difference only; q are exact small integers).
//
// Layout / geometry: MV_NW warps (8 or 16), MV_R consecutive rows per warp (each x value read
// from shared memory feeds MV_R rows), tiles of MV_NW*MV_R rows; persistent grid (below).  x
// (after the prologue) is staged per k-tile of tk values (tk a multiple of WT = 32*VPC) in shared
// memory as xs[m][tk] in a swizzled order: value e of the chunk that lane L reads in warp-tile w
// sits at w*WT + (e/4)*128 + 4L + e%4, so each float4 read of a warp is 512 contiguous bytes
// (conflict-free).  Dynamic shared: 4*(MV_M*tk + MV_M*tk/32 + MV_M*MV_NW) bytes.
// Each lane keeps MV_U - 1..MV_U chunks x MV_R rows of 16-byte loads in flight (rolling window).
#include "matvec_common.cuh"

// Geometry, set per build by cuda_linear._simt_geometry (the defaults below serve the rest)
#ifndef MV_R  // rows per warp (even under the swiglu epilogue, which pairs rows 2i, 2i+1 in a warp)
#define MV_R 2
#endif
#ifndef MV_U  // chunk slots of the rolling load window per lane and row (fewer for large MV_M: registers)
// the most that compile without spills at the register budget (MV_MINB); the Q5_K / Q6_K / Q2_K /
// Q3_K decoders need more registers
#if ACT_Q8 && MV_M <= 2
#define MV_U ((FMT == F_Q8_0 || FMT == F_Q5_K) ? 3 : 2)
#elif MV_M == 1 && (FMT == F_Q5_K || FMT == F_Q6_K || FMT == F_Q3_K)
#define MV_U 3
#elif MV_M == 1 && FMT == F_Q2_K  // its float path also keeps the halves' x sums: 1 (2-4 spill)
#define MV_U 1
#else
#define MV_U (MV_M <= 2 ? 4 : 2)
#endif
#endif
#ifndef MV_X1  // 1 (m > 1, inputs <= 4 per thread): each row's x read in one batch, the rows' loads in flight
#define MV_X1 0  // together (rms_inv_rows, stage_float_x): a small model's m-row step; the same values
#endif
#ifndef MV_STEADY  // 1: branch-free steady-state windows in the main loop (see there)
#define MV_STEADY 0
#endif
#ifndef ACT_Q8  // 1: the integer-dot contract (quantized formats only)
#define ACT_Q8 0
#endif
#if ACT_Q8 && IS_FLOAT_FMT
#error "ACT_Q8 is the integer-dot path of the quantized formats"
#endif
#ifndef MV_MINB  // blocks per SM the register budget must allow (2 = at most 128, 3 = 80 registers)
// m = 1: 3 for the float formats and the integer-dot path (Q5_K / Q6_K / Q2_K / Q3_K: 2); the
// 4-bit and 8-bit float decoders need ~115-128 registers: 2
#define MV_MINB (MV_M == 1 ? ((IS_FLOAT_FMT || (ACT_Q8 && FMT != F_Q5_K && FMT != F_Q6_K && !Q2BIT)) ? 3 : 2) : 1)
#endif
#ifndef QX_HANDOFF  // how qx_out's tile outputs reach warp 0 (2 where the build writes qx_out):
// 0: one tile buffer, a block barrier before warp 0 quantizes and one after (the buffer is reused);
// 2: two buffers by tile parity and named barriers, producer / consumer (PTX bar.arrive /
//    bar.sync): warps 1..MV_NW-1 arrive on FULL[p] without waiting, warp 0 waits on it, quantizes,
//    and arrives on EMPTY[p]; a warp waits on EMPTY[p] only before writing buffer p again two tiles
//    later.  So no warp but warp 0 waits for the tile's slowest warp or for the quantization.
#define QX_HANDOFF 0
#endif
#if QX_HANDOFF != 0 && QX_HANDOFF != 2
#error "QX_HANDOFF: 0 or 2"
#endif
#define QX_BUFS (QX_HANDOFF ? 2 : 1)  // tile buffers of MV_M * 32 floats (the wrapper allocates as many)
#define QX_BAR_FULL 1   // named barrier ids of QX_HANDOFF 2: FULL[p] = 1 + p, EMPTY[p] = 3 + p (0 is __syncthreads)
#define QX_BAR_EMPTY 3
#define WT (32 * VPC)

#define XF_NR (MV_MINB >= 3 ? 2 : 4)  // float path: float4 groups per thread and batch (4 spills at 80 registers)
// The float path reads x in float4 GROUPS (values 4f..4f+3 of a row): thread tid takes the groups
// f = b0 + tid + NT*i (i < XF_NR) of each batch b0, all of the batch's loads issued before any use,
// so a batch costs one round trip to L2.  vec: x, ldx, n_in (and normw) allow 16-byte loads;
// otherwise four guarded scalar loads give the same values.  Values at or past n read as 0.
BW24_DEVICE float4 load_group(const float* __restrict__ xr, int f, int n, bool vec) {
    if (vec) return reinterpret_cast<const float4*>(xr)[f];
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = 4 * f + e < n ? xr[4 * f + e] : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
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
#if MV_X1
    if (n4 <= STAT_NT) {  // a group a thread at most: every row's load in flight at once (one L2 round
        float4 v[MV_M];   // trip, not MV_M); the same sums (the batches' other groups add 0 * 0 exactly)
#pragma unroll
        for (int m = 0; m < MV_M; ++m) v[m] = tid < n4 ? load_group(x + (long)m * ldx, tid, n_in, vec) : zero;
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            const float4 one[1] = {v[m]};
            ss[m] = warp_sum(add_squares(one, 0.0f));
        }
    } else
#endif
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


#if !ACT_Q8
// The float path's staging of k-tile [k0, k0 + tkk) of the MV_M rows: x' = prologue(x) (rms_apply
// with inv[m] and normw, or swiglu_act with the up half x[m, n_in + k]) into xs[m][tk] at the
// swizzled positions, by the float4 groups of load_group (one L2 round trip per batch).  The same
// values as prologue_x gives element by element.
BW24_DEVICE void stage_float_x(const float* __restrict__ x, int ldx, int n_in, int k0, int tkk, int tk, int pro,
                               const float (&inv)[MV_M], const float* __restrict__ normw, bool vec, bool xb16, float* xs) {
    const int tid = threadIdx.x, g4 = (tkk + 3) / 4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if MV_X1
    if (g4 <= MV_NT) {  // a group a thread at most (a small model's rows): every row's loads in flight at
        if (tid >= g4) return;  // once, one L2 round trip instead of MV_M; the same values
        const int f = tid;
        const float4 wn = pro == PRO_RMS ? load_group(normw + k0, f, tkk, vec) : zero;
        float4 a[MV_M], u[MV_M];
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            const float* xr = x + (long)m * ldx + k0;
            a[m] = load_group(xr, f, tkk, vec);
            u[m] = pro == PRO_SWIGLU ? load_group(xr + n_in, f, tkk, vec) : zero;
        }
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            float4 v = a[m];
            if (pro == PRO_RMS)
                v = make_float4(rms_apply(v.x, inv[m], wn.x), rms_apply(v.y, inv[m], wn.y),
                                rms_apply(v.z, inv[m], wn.z), rms_apply(v.w, inv[m], wn.w));
            else if (pro == PRO_SWIGLU)
                v = make_float4(swiglu_act(v.x, u[m].x), swiglu_act(v.y, u[m].y), swiglu_act(v.z, u[m].z),
                                swiglu_act(v.w, u[m].w));
            if (xb16) v = bf16_round4(v);
            float* dst = xs + m * tk + swizzle(4 * f);
            if (4 * f + 4 <= tkk) {
                *reinterpret_cast<float4*>(dst) = v;
            } else {  // the row's last, partial group
                const float t[4] = {v.x, v.y, v.z, v.w};
                for (int e = 0; 4 * f + e < tkk; ++e) dst[e] = t[e];
            }
        }
        return;
    }
#endif
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
    float a0[MV_R], a1[MV_R], b[MV_R], b1[MV_R];
#pragma unroll
    for (int r = 0; r < MV_R; ++r) chunk_scales(raw[r], kc, a0[r], a1[r], b[r], b1[r]);
    (void)b1;
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
#if TWO_MINS
    float sxl[MV_M], sxh[MV_M];  // the x sums of values 0-15, 16-31 in natural order (the halves' mins)
#endif
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
#if TWO_MINS
            sxl[m] = __fadd_rn(__fadd_rn(__fadd_rn(g == 0 ? xl.x : __fadd_rn(sxl[m], xl.x), xl.y), xl.z), xl.w);
            sxh[m] = __fadd_rn(__fadd_rn(__fadd_rn(g == 0 ? xh.x : __fadd_rn(sxh[m], xh.x), xh.y), xh.z), xh.w);
#endif
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
#if HAS_MIN && !TWO_MINS
        const float xsum = xsb[m * xss];
#else
        (void)xsb; (void)xss;
#endif
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
#if TWO_SCALES
            acc[m][r] = __fmaf_rn(a0[r], dlo[m][r], acc[m][r]);
            acc[m][r] = __fmaf_rn(a1[r], dhi[m][r], acc[m][r]);
#if TWO_MINS
            acc[m][r] = __fmaf_rn(b[r], sxl[m], acc[m][r]);
            acc[m][r] = __fmaf_rn(b1[r], sxh[m], acc[m][r]);
#endif
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
#include "matvec_a8.cuh"
#endif

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
    Raw raw[MV_U][MV_R];
    // chunk kc of this warp's row r (of the current tile) into c
    auto fetch_row = [&](Raw& c, int r, int kc) { fetch_chunk(c, wq, wh, ws, wd, min(row0 + r, (long)n_out - 1), nck, kc); };
    auto fetch = [&](int u, int kk, int kcb, int nkc) {
        if (kk < nkc)
#pragma unroll
            for (int r = 0; r < MV_R; ++r) fetch_row(raw[u][r], r, kcb + kk);
    };
    const int nkc_first = min(tk, n_in) / VPC;
#pragma unroll
    for (int u = 0; u < MV_U; ++u) fetch(u, lane + 32 * u, 0, nkc_first);
    pdl_wait();  // x (and out, for the add epilogue) come from the previous kernel

#if ACT_Q8
    const A8Planes sink{xw, meta, n_in / 4, n_in / 32, n_in / 4};
    if (pro == PRO_QX)
        stage_qx(qx_in, n_in, 0, n_in, sink);
    else
        stage_a8(x, ldx, n_in, pro, eps, normw, xb16, sink, red);
    __syncthreads();
    const uint32_t nv_t0 = nv_table_word();  // NVFP4 / MXFP4 (dot_a8.cuh)
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
#if HAS_MIN && !TWO_MINS
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
                for (int u = 0; u < MV_U; ++u) fetch(u, lane + 32 * u, kcb, nkc);
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
                chunk_dot_a8<MV_M, MV_R>(c, kk, nck, xw, n_in / 4, meta, n_in / 32, nv_t0, acc);
#else
                chunk_dot(c, kcb + kk, xs + i * WT + 4 * lane, tk, xsum + kk, tk / 32, acc);
#endif
            };
            // slot u of window i0: consume chunk kk (this lane's (i0+u)-th of the k-tile), refill
            // the slot with chunk kk + 32*MV_U; `steady`: every refill exists (no guard)
            auto consume = [&](int u, int i0, bool steady) {
                const int kk = lane + 32 * (i0 + u);
                Raw cur[MV_R];
#pragma unroll
                for (int r = 0; r < MV_R; ++r) cur[r] = raw[u][r];
                if (steady)
                    fetch_rows(raw[u], kk + 32 * MV_U);
                else
                    fetch(u, kk + 32 * MV_U, kcb, nkc);  // refill the slot (none past the k-tile)
                dot_window(cur, i0 + u);
            };
            int i0 = 0;
            for (; i0 * 32 < nkc; i0 += MV_U) {
                // MV_STEADY: while every chunk of the window and every refill exist for all lanes,
                // the window is one branch-free block, so one slot's shared-memory x reads overlap
                // the previous slot's dot products (Nsight Compute: the int-dot matvec waited on
                // shared memory 50-57 % of its stall cycles; -5..-14 % per Q8_0 / Q4_K matvec,
                // docs/performance.md).  Same operations, same order.
                if (MV_STEADY && (i0 + 2 * MV_U) * 32 <= nkc) {
#pragma unroll
                    for (int u = 0; u < MV_U; ++u) consume(u, i0, true);
                    continue;
                }
#pragma unroll
                for (int u = 0; u < MV_U; ++u)
                    if (lane + 32 * (i0 + u) < nkc) consume(u, i0, false);
            }
        }

        // the next tile's first window goes out before this tile's reduction and stores
        const long this_row0 = row0;
        const int this_tile = tile;
        tile += gridDim.x;
        if (tile < ntiles) {
            row0 = ((long)tile * MV_NW + warp) * MV_R;
#pragma unroll
            for (int u = 0; u < MV_U; ++u) fetch(u, lane + 32 * u, 0, nkc_first);
        } else {
            pdl_trigger();  // this block's weight stream is done: the next kernel may start its loads
        }
#if ACT_Q8
        // qx_out's tile buffer: the tile ordinal's parity (QX_HANDOFF 2)
        const int tord = (this_tile - (int)blockIdx.x) / (int)gridDim.x, my_tiles = (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
        float* qxb = qxs + (QX_HANDOFF ? (tord & 1) * MV_M * 32 : 0);
        if (QX_HANDOFF == 2 && qx_out && epi == EPI_SWIGLU && warp != 0 && tord >= 2)
            named_bar_sync(QX_BAR_EMPTY + (tord & 1), MV_NT);  // warp 0 has read this buffer (tile tord - 2)
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
        // the next matvec's x: warp 0 quantizes them once every warp's are in (QX_HANDOFF above).
        // (A hand-off where the tile's last warp to arrive quantizes, found by a shared-memory
        // arrival count and a spin, measured slower: docs/performance.md.)
        if (qx_out && epi == EPI_SWIGLU) {
            const int nq = n_out >> 1;
            if (QX_HANDOFF == 2 && warp != 0)
                named_bar_arrive(QX_BAR_FULL + (tord & 1), MV_NT);  // this warp's outputs are in: go on
            else if (QX_HANDOFF == 2)
                named_bar_sync(QX_BAR_FULL + (tord & 1), MV_NT);
            else
                __syncthreads();
            if (warp == 0) {
                qx_write_tile(qx_out, nq, this_tile, qxb);
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
