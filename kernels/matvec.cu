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
//   NumPy reference: out = xin @ W.T with W = QTensor.dequantize() (cuda_weights.decode_planes).
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
// Layout / geometry: 256 threads = 8 warps, MV_R consecutive rows per warp (each x value read
// from shared memory feeds MV_R rows), grid = ceil(n_out / (8*MV_R)).  x (after the prologue)
// is staged per k-tile of tk values (tk a multiple of WT = 32*VPC) in shared memory as
// xs[m][tk] in a swizzled order: value e of the chunk that lane L reads in warp-tile w sits at
// w*WT + (e/4)*128 + 4L + e%4, so each float4 read of a warp is 512 contiguous bytes
// (conflict-free).  Dynamic shared: 4*(MV_M*tk + MV_M*tk/32 + MV_M*8) bytes.
// Each lane keeps MV_U chunks x MV_R rows of 16-byte loads in flight.
#include "common.cuh"
#include "formats.cuh"

#ifndef MV_M
#define MV_M 1
#endif
#ifndef MV_R
#define MV_R 2
#endif
#ifndef MV_U  // chunks in flight per lane and row: fewer for large MV_M (registers)
// m = 1 with float or Q8_0 weights is bound by bytes in flight, not instructions: 8 chunks x 2
// rows of 16 B per lane (115 / 127 registers, no spills at sm_90a) keep ~128 KB in flight per
// SM, where 4 left the 4096-row projections at ~50 % of the copy bandwidth (H200 profile,
// bench/NOTES.md).  The 4-bit decoders are instruction-bound and would spill with 8.
#if MV_M == 1 && (IS_FLOAT_FMT || FMT == F_Q8_0)
#define MV_U 8
#else
#define MV_U (MV_M <= 2 ? 4 : 2)
#endif
#endif
#ifndef MV_MINB  // blocks per SM the register budget must allow (2 = at most 128 registers)
#define MV_MINB (MV_M == 1 ? 2 : 1)
#endif
#define MV_NW 8
#define MV_NT (MV_NW * 32)
#define WT (32 * VPC)

#define PRO_NONE 0
#define PRO_RMS 1
#define PRO_SWIGLU 2
#define EPI_STORE 0
#define EPI_ADD 1
#define EPI_SWIGLU 2  // rows interleaved gate_i, up_i: out[m, i] = silu(y[2i]) * y[2i+1]
static_assert(MV_R % 2 == 0, "the swiglu epilogue pairs rows (2i, 2i+1) inside one warp");

// swizzled smem index -> natural position in the tile
BW24_DEVICE int unswizzle(int s) {
    const int w = s / WT, rem = s - w * WT;
    const int grp = rem >> 7, l4 = rem & 127;
    return w * WT + (l4 >> 2) * VPC + grp * 4 + (l4 & 3);
}

BW24_DEVICE float prologue_x(const float* __restrict__ x, long off, int p, int n_in, int pro, float inv,
                             const float* __restrict__ normw) {
    const float v = x[off + p];
    if (pro == PRO_RMS) return __fmul_rn(__fmul_rn(v, inv), normw[p]);
    if (pro == PRO_SWIGLU) return swiglu_act(v, x[off + n_in + p]);
    return v;
}

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

extern "C" __global__ void __launch_bounds__(MV_NT, MV_MINB)
matvec(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
       const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
       float* __restrict__ out, const float* __restrict__ normw, int n_out, int n_in, int ldx, int tk,
       int pro, int epi, float eps) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);  // [MV_M][tk], swizzled
    float* xsum = xs + MV_M * tk;                 // [MV_M][tk/32]
    float* red = xsum + MV_M * (tk / 32);         // [MV_M][MV_NW]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nck = n_in / VPC;
    const long row0 = ((long)blockIdx.x * MV_NW + warp) * MV_R;

    // The first batch of weight loads goes out before the prologue: its memory latency then
    // overlaps the prologue's x reads, reduction and staging instead of following them (the
    // small projections are a few microseconds long, so this start-up is a large share).
    Raw raw[MV_U][MV_R];
    const int nkc_first = min(tk, n_in) / VPC;
#pragma unroll
    for (int u = 0; u < MV_U; ++u) {
        const int kk = lane + 32 * u;
        if (kk < nkc_first)
#pragma unroll
            for (int r = 0; r < MV_R; ++r) fetch_chunk(raw[u][r], wq, wh, ws, wd, min(row0 + r, (long)n_out - 1), nck, kk);
    }

    float inv[MV_M];
#pragma unroll
    for (int m = 0; m < MV_M; ++m) inv[m] = 1.0f;
    if (pro == PRO_RMS) {
        float ss[MV_M];
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
            float s = 0.0f;
            for (int p = tid; p < n_in; p += MV_NT) {
                const float v = x[(long)m * ldx + p];
                s = __fmaf_rn(v, v, s);
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
            for (int w = 1; w < MV_NW; ++w) s = __fadd_rn(s, red[m * MV_NW + w]);
            inv[m] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)n_in), eps)));
        }
    }

    float acc[MV_M][MV_R];
#pragma unroll
    for (int m = 0; m < MV_M; ++m)
#pragma unroll
        for (int r = 0; r < MV_R; ++r) acc[m][r] = 0.0f;

    for (int k0 = 0; k0 < n_in; k0 += tk) {
        const int tkk = min(tk, n_in - k0);
        __syncthreads();  // the previous tile (and red[]) is consumed
#pragma unroll
        for (int m = 0; m < MV_M; ++m)
            for (int s = tid; s < tk; s += MV_NT) {
                const int t = unswizzle(s);
                if (t < tkk) xs[m * tk + s] = prologue_x(x, (long)m * ldx, k0 + t, n_in, pro, inv[m], normw);
            }
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
        const int nkc = tkk / VPC, kcb = k0 / VPC;
        for (int i0 = 0; i0 * 32 < nkc; i0 += MV_U) {
            if (k0 != 0 || i0 != 0) {  // the first batch was fetched before the prologue
#pragma unroll
                for (int u = 0; u < MV_U; ++u) {
                    const int kk = lane + 32 * (i0 + u);
                    if (kk < nkc)
#pragma unroll
                        for (int r = 0; r < MV_R; ++r)
                            fetch_chunk(raw[u][r], wq, wh, ws, wd, min(row0 + r, (long)n_out - 1), nck, kcb + kk);
                }
            }
#pragma unroll
            for (int u = 0; u < MV_U; ++u) {
                const int kk = lane + 32 * (i0 + u);
                if (kk < nkc)
                    chunk_dot(raw[u], kcb + kk, xs + (i0 + u) * WT + 4 * lane, tk, xsum + kk, tk / 32, acc);
            }
        }
    }

#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
        float v[MV_R];
#pragma unroll
        for (int r = 0; r < MV_R; ++r) {
            v[r] = warp_sum(acc[m][r]);
            if (gscale && row0 + r < n_out) v[r] = __fmul_rn(v[r], gscale[row0 + r]);
        }
        if (lane != 0) continue;
        if (epi == EPI_SWIGLU) {  // rows (2i, 2i+1) = (gate_i, up_i) -> out[m, i], row stride n_out/2
#pragma unroll
            for (int r = 0; r + 1 < MV_R; r += 2)
                if (row0 + r + 1 < n_out) out[(long)m * (n_out >> 1) + ((row0 + r) >> 1)] = swiglu_act(v[r], v[r + 1]);
        } else {
#pragma unroll
            for (int r = 0; r < MV_R; ++r) {
                const long o = row0 + r;
                if (o < n_out) {
                    float* dst = out + (long)m * n_out + o;
                    *dst = epi == EPI_ADD ? __fadd_rn(*dst, v[r]) : v[r];
                }
            }
        }
    }
}
