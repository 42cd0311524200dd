// matvec_tc.cu — the decode matvec on tensor cores for NVFP4 weights on the float contract and
// F16 weights (cuda_linear.matvec_impl picks it; every other build runs matvec.cu).
//
// Contract: matvec.cu's (y = gs * W . prologue(x), prologues 0-2 with the PRO_BF16 flag,
// epilogues store / add / swiglu, rows bit-identical for MV_M = 1..8); no integer-dot contract,
// no QX buffers.  NumPy reference: kernel_refs.matvec_ref.
//
// Napkin math (Qwen3-8B, m = 1, H100 SXM 3.35 TB/s): a weight is read once and feeds 2 FLOPs per
// token, so the kernel is DRAM-bound at any m <= 8 (NVFP4 4.5 bits per weight: ~3.6 FLOP/byte;
// F16 1 FLOP/byte; the tensor cores' ridge is ~300).  The floor is the weight bytes over the
// bandwidth: NVFP4 o 4096 x 4096 = 9.4 MB -> 2.8 us, gate|up 24576 x 4096 = 57 MB -> 17 us;
// F16 o 34 MB -> 10 us.  The SIMT kernel spends ~6 instructions per NVFP4 weight turning codes
// into floats (instruction-bound at ~20 % of the bandwidth, docs/performance.md); here the tensor
// cores multiply and a code costs ~2 instructions, so the loads in flight set the pace.
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
// (cuda_linear.persistent_grid); the prologue statistics and x' staging are per block, in one
// float4 pass plus one in-place conversion.  Dynamic shared: MV_M * tkx * 4 (x, tkx a multiple
// of 4 * VPC * TC_NW * TC_U) + TC_NW KB + 8 * TC_NW + 8 * MV_M bytes.
// F16 weights: the 16-byte chunk holds 8 values in natural order, so a super-step covers 32
// values of a row and has 2 k-steps; k-step ks puts values 4ks, 4ks+1 (word 2ks) in slots 2t,
// 2t+1 and 4ks+2, 4ks+3 (word 2ks+1) in 2t+8, 2t+9 — the A registers are the loaded words
// themselves, no decoding; x takes the scaled f16 split above.

#include "matvec_common.cuh"

#if FMT != F_NVFP4 && FMT != F_F16
#error "matvec_tc: NVFP4 or F16 weights"
#endif
// TC_NW: warps per block (split-K ways); TC_U: super-steps per lane in flight, TC_U x (2 tiles x
// 2 rows) 16-byte loads (cuda_linear.tc_geometry sets both)
#if !defined(TC_NW) || !defined(TC_U)
#error "matvec_tc: TC_NW and TC_U (cuda_linear.tc_geometry)"
#endif
#define TC_ROWS 32
#define TC_KSTEPS (VPC / 4)  // k-steps per super-step: NVFP4 8 (h = ks / 4, wi = ks % 4), F16 2

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

// the prologue's output at input p of token row off (one value; the staging of a k-tile when x
// does not stay resident)
BW24_DEVICE float prologue_x(const float* __restrict__ x, long off, int p, int n_in, int pro, float inv,
                             const float* __restrict__ normw) {
    const float v = x[off + p];
    if (pro == PRO_RMS) return rms_apply(v, inv, normw[p]);
    if (pro == PRO_SWIGLU) return swiglu_act(v, x[off + n_in + p]);
    return v;
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
        mscale[m] = __uint_as_float((uint32_t)(127 + 13 - max(-100, min(100, e))) << 23);
    }
    __syncthreads();
}

// four consecutive prologue outputs v -> x' = v * sc split into f16 hi/lo as the staged uint4 {hi(0,1), hi(2,3), lo(0,1), lo(2,3)}
BW24_DEVICE uint4 tc_split4(float4 v, float sc) {
    v = make_float4(__fmul_rn(v.x, sc), __fmul_rn(v.y, sc), __fmul_rn(v.z, sc), __fmul_rn(v.w, sc));
    const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
    const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
    const __half2 l01 = __floats2half2_rn(__fsub_rn(v.x, f01.x), __fsub_rn(v.y, f01.y));
    const __half2 l23 = __floats2half2_rn(__fsub_rn(v.z, f23.x), __fsub_rn(v.w, f23.y));
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
    const bool xb16 = (pro & PRO_BF16) != 0;  // x rounded to bf16 before the split
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
                            mma_f16_16816(acc[mt], a[2 * mt][0], a[2 * mt + 1][0], a[2 * mt][1], a[2 * mt + 1][1], b.x, b.y);
                            mma_f16_16816(acc[mt], a[2 * mt][0], a[2 * mt + 1][0], a[2 * mt][1], a[2 * mt + 1][1], b.z, b.w);
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
