// dot_a8.cuh — the integer-dot contract's device pieces (ACT_Q8 = 1, the quantized formats): the
// shared-memory layout of the quantized x (two int8 code planes and the per-32-input block records;
// A8Planes), the staging of one float4 group through a sink (a8_stage_group: A8Planes, or another
// kernel's layout), and the chunk products as exact integer dots (dp4a) scaled once per chunk
// (chunk_dot_a8).  Included by matvec_a8.cuh (for matvec.cu and matvec_mma.cu) and by
// moe_experts.cu.  Contract: matvec.cu's header (ACT_Q8); NumPy reference: kernel_refs.act_quant_ref.
// No geometry: the callers pass the tokens (M) and rows (R) per call.
#pragma once
#include "common.cuh"
#include "formats.cuh"

// Q4_K, NVFP4 and MXFP4 join both code levels in one integer per dot (256 dot_h + dot_l < 2^24 for
// their 4-bit codes): one I2F and FMA per half chunk instead of two (Q4_K decode +7.5 %,
// docs/performance.md)
#define A8_JOIN (E2M1_FMT || FMT == F_Q4_K)
// Shared x per token m and plane p (0: the high codes h, 1: the low
// codes l; common.cuh act_quant_lane): the int8 codes as u32 words (wpm = n_in/4 per plane), and
// one uint4 per 32-input block {plane scale as float bits (2^e, 2^(e-8)), code sum of inputs
// 0-15, of 16-31, of all 32}; with A8_JOIN (both levels in one integer dot, chunk_dot_a8) one
// record per block in plane 0's place: NVFP4 {2^(e-1) (the weights' 2^7 folded in:
// nvfp4_scales_f16), seed of inputs 0-15, of 16-31 (-128 * (256 * sum h + sum l): removes the
// weight bytes' offset 128), 0}; Q4_K {2^(e-8), 0, 0, the block's x sum 2^(e-8) (256 * sum h +
// sum l) as float bits (exact)}; MXFP4 {2^(e-8), NVFP4's seeds, 0}.  Word layout: Q8_0
// (16-value chunks) natural order, a chunk = 4 words at 4*kc; 32-value chunks two halves (inputs 0-15 of chunk kc at words 4*kc.., 16-31 at 4*(nck+kc)..)
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

// The staged record(s) of 32-input block b from its exponent and code sums (h / l levels, inputs
// 0-15 and 16-31); one writer for stage_a8 and stage_qx, so both stage the same bits.
BW24_DEVICE void a8_records(uint4* metam, int nb, int b, int e, int sh0, int sh1, int sl0, int sl1) {
#if FMT == F_NVFP4
    metam[b] = make_uint4(__float_as_uint(pow2f(e - 1)), (uint32_t)(-128 * (256 * sh0 + sl0)),
                          (uint32_t)(-128 * (256 * sh1 + sl1)), 0u);
    (void)nb;
#elif FMT == F_MXFP4  // its scale a = e8m0 / 2 is a power of two: 2^(e-8), no 2^7 to fold in
    metam[b] = make_uint4(__float_as_uint(pow2f(e - 8)), (uint32_t)(-128 * (256 * sh0 + sl0)),
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

// Where the integer-dot staging writes (the sink of a8_stage_group, matvec_a8.cuh's stage_a8 and
// stage_qx): token m's codes of level h as u32 words at a8_word positions from codes(m) (16-byte
// aligned), those of level l at codes(m) + lstride; and the records of 32-input block b from its
// exponent and code sums, by record(recs(m), b, e, sh0, sh1, sl0, sl1).  A8Planes is the layout
// above (chunk_dot_a8 reads it): planes of wpm = n_in/4 words back to back (token m's h plane at
// xw + 2m*wpm, then its l plane), a8_records' uint4s at meta + 2m*nb; matvec_mma.cu has its own.
struct A8Planes {
    uint32_t* xw;
    uint4* meta;
    int wpm, nb;
    int lstride;  // = wpm
    BW24_DEVICE uint32_t* codes(int m) const { return xw + 2 * m * wpm; }
    BW24_DEVICE uint4* recs(int m) const { return meta + 2 * m * nb; }
    BW24_DEVICE void record(uint4* r, int b, int e, int sh0, int sh1, int sl0, int sl1) const {
        a8_records(r, nb, b, e, sh0, sh1, sl0, sl1);
    }
};

// One float4 group f (inputs 4f..4f+3 of an x row, xin final: prologue and bf16 rounding applied)
// quantized (act_quant_lane) into its code words and, by the block's first lane, the block's
// record(s), through the sink: the token's words at xwm = sink.codes(m), its records at recm =
// sink.recs(m) (the callers hoist both).  Whole warps call it, an aligned group of 8 lanes holding
// one 32-input block (the group reductions are shuffles); `ok` false: take part in the shuffles
// only.
template <class Sink, class Rec>
BW24_DEVICE void a8_stage_group(int f, float4 a, bool ok, uint32_t* xwm, Rec* recm, int nck, const Sink& sink) {
    int e, sh, sl;
    uint32_t ql;
    const uint32_t qh = act_quant_lane(a, e, ql, sh, sl);
    const int sh_other = __shfl_xor_sync(0xffffffffu, sh, 4), sl_other = __shfl_xor_sync(0xffffffffu, sl, 4);
    if (!ok) return;
    xwm[a8_word(4 * f, nck)] = qh;
    xwm[sink.lstride + a8_word(4 * f, nck)] = ql;
    if ((threadIdx.x & 7) == 0)  // lanes 0-3 hold inputs 0-15, lanes 4-7 inputs 16-31
        sink.record(recm, f >> 3, e, sh, sh_other, sl, sl_other);
}

// NVFP4's / MXFP4's table word 0x03020100 (nvfp4_weight_bytes) in a vector register: a constant,
// or a shuffle of one from lane 0, went to a uniform register and was copied back before every
// PRMT; a lane-indexed shuffle's result is not provably uniform
BW24_DEVICE uint32_t nv_table_word() {
    const uint32_t lane = threadIdx.x & 31;
    return __shfl_sync(0xffffffffu, 0x03020100u + lane, lane) - lane;
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

#if E2M1_FMT
BW24_DEVICE uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {  // PTX prmt, default mode (bit 3: sign replicate)
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
// Four E2M1 codes (NVFP4, MXFP4) as selector nibbles (bits 0-15; bit 3 of each the sign) ->
// bytes (doubled value + 128, unsigned 116..140), byte j = code j.  PRMT's default mode replicates the selected
// byte's sign bit when the selector's bit 3 is set, and every table byte is < 0x80: so pos = the
// doubled magnitude where the sign is clear, else 0, and neg the same on the flipped selectors;
// pos + 128 - neg per byte has no carry or borrow (one IADD3).  Code 8 (-0) gives 128 (+0).
// A selector word (formats.cuh: the codes of values 4g+j in bits 0-15, of 16+4g+j in 16-31) ->
// the weight-byte words of both halves: 9 operations per 8 codes (a nibble layout needs ~19).
// t0 = 0x03020100 (table bytes 0-3) comes from the caller in a register: PRMT's first operand must
// be one, and ptxas otherwise re-materializes the constant before every PRMT (nvdisasm).
BW24_DEVICE void nvfp4_weight_bytes(uint32_t w, uint32_t t0, uint32_t& lo, uint32_t& hi) {
    const uint32_t t1 = 0x0C080604u;  // doubled E2M1 magnitudes 0,1,2,3 (t0), 4,6,8,12
    const uint32_t n = w ^ 0x88888888u;
    lo = prmt(t0, t1, w) + 0x80808080u - prmt(t0, t1, n);
    hi = prmt(t0, t1, w >> 16) + 0x80808080u - prmt(t0, t1, n >> 16);
}
#endif
#if FMT == F_NVFP4
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

// One chunk of R rows against M quantized x rows.  Per row, token and plane (h, then l):
// the integer dots of the chunk's halves (values 0-15, 16-31; Q8_0: the 16 values), the code
// offset removed through the dp4a seed (-offset * code sum, exact), then in this order
//   TWO_SCALES: acc += dot_lo * (a0 * s); acc += dot_hi * (a1 * s); TWO_MINS (Q2_K) then
//               acc += sum_lo * (b0 * s); acc += sum_hi * (b1 * s)
//   otherwise:  acc += (dot_lo + dot_hi) * (a0 * s); HAS_MIN: acc += sum32 * (b * s)
// with s the plane's scale (a * s is exact), each an FMA, the same for every M.
// A8_JOIN, NVFP4, per row, token and half: D = 256 * dot_h + dot_l by one dp4a chain (the h
// chain's result times 256 plus the record's seed seeds the l chain), then acc += float(D) *
// (a * s), s = 2^(e-1), a = E4M3 * 2^-8 (the 8 and the 2^7 of ue4m3 / 2 in s); float(D) exact
// (I2F).  Q4_K: D over the whole chunk (halves as two chains, then added), acc += float(D) *
// (a * 2^(e-8)); acc += b * xsum (the record's exact block sum).  MXFP4: D over the whole chunk
// (NVFP4's weight bytes and seeds), acc += float(D) * (a * 2^(e-8)), a = e8m0 / 2 (|D| <= 32 x 12
// x 32896 < 2^24: exact).
template <int M, int R>
BW24_DEVICE void chunk_dot_a8(const Raw (&raw)[R], int kc, int nck, const uint32_t* xw, int wpm, const uint4* meta, int nb,
                              uint32_t nv_t0, float (&acc)[M][R]) {
    float a0[R], a1[R], b[R], b1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) chunk_scales(raw[r], kc, a0[r], a1[r], b[r], b1[r]);
    (void)b1;
#if !E2M1_FMT
    (void)nv_t0;
#endif
#if FMT == F_Q8_0
    (void)nck; (void)a1; (void)b;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xw + (2 * m + p) * wpm + 4 * kc);
            const float dx = __uint_as_float(meta[(2 * m + p) * nb + (kc >> 1)].x);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                int s = dp4a_s8(raw[r].q.x, xv.x, 0);
                s = dp4a_s8(raw[r].q.y, xv.y, s);
                s = dp4a_s8(raw[r].q.z, xv.z, s);
                s = dp4a_s8(raw[r].q.w, xv.w, s);
                acc[m][r] = __fmaf_rn(small_int_float(s), __fmul_rn(a0[r], dx), acc[m][r]);
            }
        }
#elif A8_JOIN  // NVFP4, MXFP4, Q4_K
    uint32_t cl[R][4], ch[R][4];
#if E2M1_FMT
    (void)a1; (void)b;
#if FMT == F_NVFP4
    (void)a0;
    float s0[R], s1[R];
#endif
#pragma unroll
    for (int r = 0; r < R; ++r) {
#if FMT == F_NVFP4
        nvfp4_scales_f16(raw[r].s.x, kc, s0[r], s1[r]);
#endif
#pragma unroll
        for (int g = 0; g < 4; ++g) nvfp4_weight_bytes(word_of(raw[r].q, g), nv_t0, cl[r][g], ch[r][g]);
    }
#else
    (void)a1;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int g = 0; g < 4; ++g) qwords(raw[r], g, cl[r][g], ch[r][g]);
#endif
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const uint32_t* xh = xw + 2 * m * wpm;  // plane h; plane l at + wpm
        const uint4 hl = *reinterpret_cast<const uint4*>(xh + 4 * kc);
        const uint4 hh = *reinterpret_cast<const uint4*>(xh + 4 * (nck + kc));
        const uint4 ll = *reinterpret_cast<const uint4*>(xh + wpm + 4 * kc);
        const uint4 lh = *reinterpret_cast<const uint4*>(xh + wpm + 4 * (nck + kc));
        const uint4 mt = meta[2 * m * nb + kc];
        const float dx = __uint_as_float(mt.x);
        // the weight bytes' offset (E2M1: 128) removed through the l chains' seeds; Q4_K has none
        const int seed_lo = E2M1_FMT ? (int)mt.y : 0, seed_hi = E2M1_FMT ? (int)mt.z : 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
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
#elif FMT == F_MXFP4
            acc[m][r] = __fmaf_rn(__int2float_rn(il + ih), __fmul_rn(a0[r], dx), acc[m][r]);
#else
            acc[m][r] = __fmaf_rn(__int2float_rn(il + ih), __fmul_rn(a0[r], dx), acc[m][r]);
            acc[m][r] = __fmaf_rn(b[r], __uint_as_float(mt.w), acc[m][r]);  // the record's exact x sum
#endif
        }
    }
#else
    uint32_t cl[R][4], ch[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int g = 0; g < 4; ++g) qwords(raw[r], g, cl[r][g], ch[r][g]);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint32_t* xp = xw + (2 * m + p) * wpm;
            const uint4 xl = *reinterpret_cast<const uint4*>(xp + 4 * kc);
            const uint4 xh = *reinterpret_cast<const uint4*>(xp + 4 * (nck + kc));
            const uint4 mt = meta[(2 * m + p) * nb + kc];
            const float dx = __uint_as_float(mt.x);
#pragma unroll
            for (int r = 0; r < R; ++r) {
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
#if TWO_MINS  // the halves' code sums with their mins
                acc[m][r] = __fmaf_rn(small_int_float((int)mt.y), __fmul_rn(b[r], dx), acc[m][r]);
                acc[m][r] = __fmaf_rn(small_int_float((int)mt.z), __fmul_rn(b1[r], dx), acc[m][r]);
#endif
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
