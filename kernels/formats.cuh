// formats.cuh — device decoders of the repacked weight layouts (bw24chat/backends/cuda_weights.py
// writes them; its decode_planes() is the NumPy mirror of this file, tested bit for bit against
// bw24chat.quants.dequantize in tests/test_repack.py).  Shared by dequant.cu, matvec.cu, gemm.cu.
//
// One compile = one format: FMT (default BF16).  Every format is cut into 16-byte CHUNKS of VPC
// values (the 2-bit family: 8-byte ones), stored row-major in plane q ([rows, in/VPC] uint4), so
// that one thread's load covers whole scale groups and consecutive lanes read consecutive chunks
// (coalesced):
//   F32   VPC 4   q = the floats                     BF16/F16 VPC 8  q = the 16-bit values
//   Q8_0  VPC 16  q = int8 values; s = f16 d per 32 values (u16 [rows, in/32])
//   4-bit family, VPC 32: q = a "nibble chunk": byte j low nibble = value j, high nibble = value
//         16+j (ggml's Q4_0 order, kept for every format, repacked where ggml differs)
//     Q4_0  s = f16 d per chunk                     Q4_1  s = (f16 d, f16 m) per chunk (u32)
//     Q5_0  s = d; h = u32 5th bits per chunk        Q5_1  s = (d, m); h = u32
//     Q4_K  s = the 16 leading bytes of the 256-block (d, dmin, 12 B packed 6-bit scale/min)
//           per superblock (uint4); chunk = sub-block kc%8
//     Q5_K  as Q4_K + h = u32 5th bits per chunk
//     Q6_K  s = the 16 int8 scales per superblock (uint4); d = f16 per superblock (u16);
//           h = uint2 2-bit highs per chunk; values 0-15 of a chunk use scale 2*(kc%8), 16-31
//           use 2*(kc%8)+1
//     NVFP4 q = four "selector words" instead of a nibble chunk: word g holds the E2M1 codes
//           of values 4g+j at bits 4j..4j+3 and of values 16+4g+j at bits 16+4j.. (j = 0..3),
//           so each 16-bit half is four PRMT selector nibbles as it stands (qwords, nvfp4_s4;
//           dot_a8.cuh nvfp4_weight_bytes);
//           s = 4 ue4m3 scales per 64 values (u32); chunk kc uses bytes 2*(kc&1), +1 (values
//           0-15, 16-31), stored with bit 7 clear and 0x7F as 0x00 (cuda_weights.
//           nvfp4_scale_bytes: the same values), so (byte << 7) is f16 bits of E4M3 * 2^-8.
//           The per-tensor FP32 global scale is a
//           per-row float array (fused matrices may concatenate tensors with different scales)
//           applied by the caller: matvec multiplies the finished row sum, dequant each value.
//     MXFP4 q = selector words as NVFP4 (a chunk is one ggml block of 32 E2M1 codes, OCP MX v1.0);
//           s = the block's e8m0 exponent byte as stored (u8 per chunk), one scale for all 32
//   2-bit family, VPC 32, q = 8 bytes per chunk (uint2, [rows, nck]: the formats keep their bits
//         per weight): word x byte j bits 2g,2g+1 = the 2-bit code of value 4g+j, word y: of
//         16+4g+j (the Q6_K h layout); chunk kc = values 32 (kc%8).. of its 256-superblock,
//         values 0-15 in sub-block 2 (kc%8), 16-31 in 2 (kc%8) + 1
//     Q2_K  s = the 16 sub-block bytes (scale | min << 4) per superblock (uint4); d = (f16 d,
//           f16 dmin) per superblock (u32)
//     Q3_K  h = u32 3rd bits per chunk (the 5th-bit layout), a clear bit is code - 4; s = the 16
//           unpacked int8 scales (6-bit - 32, quants.q3_k_scales) per superblock (uint4); d =
//           f16 per superblock (u16)
//   h-plane bit layout (so that a single shift + mask merges the high bits of 4 values into the
//   byte lanes of the nibble word g = bytes 4g..4g+3, whose low nibbles are values 4g+j and high
//   nibbles values 16+4g+j, j = 0..3):
//     5th bits (u32): bit 8j+g = value 4g+j, bit 8j+4+g = value 16+4g+j
//     Q6_K (uint2):  word x byte j bits 2g,2g+1 = high 2 bits of value 4g+j; word y: of 16+4g+j
//
// Exact values (bit-equal to quants.py, which mirrors ggml-quants.c), per chunk:
//   w = a*q            (Q4_0, Q5_0, Q8_0 as q*d, Q6_K with a = d*sc, NVFP4 with a = ue4m3/2,
//                       MXFP4 with a = e8m0/2)
//   w = a*q + b        (Q4_1/Q5_1: b = m; Q4_K/Q5_K/Q2_K: a = d*sc, b = -(dmin*mn), and x + (-y)
//                       is bit-identical to x - y; Q2_K a and b per half chunk)
// with q an exact small integer held in a float; rounded product then rounded sum (no FMA).
// Small integers become floats without I2F (quarter rate on sm_90): PRMT puts byte j under the
// exponent of 2^23 and one exact FADD removes 2^23 + offset.
#pragma once

#define F_F32 0
#define F_F16 1
#define F_BF16 2
#define F_Q8_0 3
#define F_Q4_0 4
#define F_Q4_1 5
#define F_Q5_0 6
#define F_Q5_1 7
#define F_Q4_K 8
#define F_Q5_K 9
#define F_Q6_K 10
#define F_NVFP4 11
#define F_MXFP4 12
#define F_Q2_K 13
#define F_Q3_K 14

#ifndef FMT
#define FMT F_BF16
#endif

#if FMT == F_F32
#define VPC 4
#elif FMT == F_F16 || FMT == F_BF16
#define VPC 8
#elif FMT == F_Q8_0
#define VPC 16
#else
#define VPC 32
#endif
#define IS_FLOAT_FMT (FMT <= F_BF16)
#define E2M1_FMT (FMT == F_NVFP4 || FMT == F_MXFP4)  // E2M1 codes as selector words
#define HAS_MIN (FMT == F_Q4_1 || FMT == F_Q5_1 || FMT == F_Q4_K || FMT == F_Q5_K || FMT == F_Q2_K)
#define TWO_SCALES (FMT == F_Q6_K || FMT == F_NVFP4 || FMT == F_Q2_K || FMT == F_Q3_K)
#define TWO_MINS (FMT == F_Q2_K)  // a min per half chunk (chunk_scales b0, b1)
#define Q2BIT (FMT == F_Q2_K || FMT == F_Q3_K)  // q: 8-byte chunks of 2-bit codes
#define HAS_H5 (FMT == F_Q5_0 || FMT == F_Q5_1 || FMT == F_Q5_K)
#if FMT == F_Q4_0
#define QOFF 8.0f
#elif FMT == F_Q5_0
#define QOFF 16.0f
#elif FMT == F_Q6_K
#define QOFF 32.0f
#elif FMT == F_Q3_K
#define QOFF 4.0f
#elif FMT == F_Q8_0
#define QOFF 128.0f
#else
#define QOFF 0.0f
#endif

// the raw data of one chunk (unused fields are never assigned and cost no registers)
struct Raw {
    uint4 q;
    uint2 h;
    uint4 s;
    uint32_t d;
};

BW24_DEVICE uint4 ld_stream16(const uint4* p) {
    // weights are read once per kernel: do not let them evict x / scales from L1
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

BW24_DEVICE uint2 ld_stream8(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

BW24_DEVICE uint32_t word_of(const uint4& v, int g) { return g == 0 ? v.x : g == 1 ? v.y : g == 2 ? v.z : v.w; }
BW24_DEVICE uint32_t byte_of(uint32_t w, int j) { return (w >> (8 * j)) & 0xFFu; }

// One row's planes as pointers (row_planes), then the loads of its chunk kc (fetch_chunk_at);
// fetch_chunk is the two in one.  Unused planes are dead code for the format and cost no
// registers.
struct RowPlanes {
    const void* q;
    const void* h;
    const void* s;
    const void* d;
};
BW24_DEVICE RowPlanes row_planes(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
                                 const void* __restrict__ wd, long row, int nck) {
    RowPlanes p;
#if Q2BIT
    p.q = (const uint2*)wq + row * nck;
#else
    p.q = wq + row * nck;
#endif
    p.h = nullptr;
    p.s = nullptr;
    p.d = nullptr;
#if HAS_H5 || FMT == F_Q3_K
    p.h = (const unsigned int*)wh + row * nck;
#elif FMT == F_Q6_K
    p.h = (const uint2*)wh + row * nck;
#endif
#if FMT == F_Q8_0  // one scale record per 2 chunks
    p.s = (const unsigned short*)ws + row * (nck >> 1);
#elif FMT == F_NVFP4
    p.s = (const unsigned int*)ws + row * (nck >> 1);
#elif FMT == F_MXFP4
    p.s = (const unsigned char*)ws + row * nck;
#elif FMT == F_Q4_0 || FMT == F_Q5_0
    p.s = (const unsigned short*)ws + row * nck;
#elif FMT == F_Q4_1 || FMT == F_Q5_1
    p.s = (const unsigned int*)ws + row * nck;
#elif FMT == F_Q4_K || FMT == F_Q5_K || FMT == F_Q6_K || Q2BIT
    p.s = (const uint4*)ws + row * (nck >> 3);
#if FMT == F_Q6_K || FMT == F_Q3_K
    p.d = (const unsigned short*)wd + row * (nck >> 3);
#elif FMT == F_Q2_K
    p.d = (const unsigned int*)wd + row * (nck >> 3);
#endif
#endif
    (void)wh; (void)ws; (void)wd;
    return p;
}

// issue the loads of chunk kc of the row whose planes are p
BW24_DEVICE void fetch_chunk_at(Raw& r, const RowPlanes& p, int kc) {
#if Q2BIT
    const uint2 q2 = ld_stream8((const uint2*)p.q + kc);
    r.q.x = q2.x;
    r.q.y = q2.y;
#else
    r.q = ld_stream16((const uint4*)p.q + kc);
#endif
#if HAS_H5 || FMT == F_Q3_K
    r.h.x = __ldg((const unsigned int*)p.h + kc);
#elif FMT == F_Q6_K
    r.h = __ldg((const uint2*)p.h + kc);
#endif
#if FMT == F_Q8_0
    r.s.x = (uint32_t)__ldg((const unsigned short*)p.s + (kc >> 1));
#elif FMT == F_NVFP4
    r.s.x = __ldg((const unsigned int*)p.s + (kc >> 1));
#elif FMT == F_MXFP4
    r.s.x = __ldg((const unsigned char*)p.s + kc);
#elif FMT == F_Q4_0 || FMT == F_Q5_0
    r.s.x = __ldg((const unsigned short*)p.s + kc);
#elif FMT == F_Q4_1 || FMT == F_Q5_1
    r.s.x = __ldg((const unsigned int*)p.s + kc);
#elif FMT == F_Q4_K || FMT == F_Q5_K || FMT == F_Q6_K || Q2BIT
    r.s = __ldg((const uint4*)p.s + (kc >> 3));
#if FMT == F_Q6_K || FMT == F_Q3_K
    r.d = __ldg((const unsigned short*)p.d + (kc >> 3));
#elif FMT == F_Q2_K
    r.d = __ldg((const unsigned int*)p.d + (kc >> 3));
#endif
#endif
}

// issue the loads of chunk kc of row `row` (nck = chunks per row)
BW24_DEVICE void fetch_chunk(Raw& r, const uint4* __restrict__ wq, const void* __restrict__ wh,
                             const void* __restrict__ ws, const void* __restrict__ wd, long row, int nck, int kc) {
    fetch_chunk_at(r, row_planes(wq, wh, ws, wd, row, nck), kc);
}

// ue4m3 scale halved (quants.ue4m3_to_f32_half) of a repacked scale byte (bit 7 clear, the
// reference's zero-decoding 0x7F stored as 0x00: cuda_weights.nvfp4_scale_bytes): the 7 bits
// placed at f16 bits 7-13 read as E4M3 * 2^-8 exactly, subnormals included (f16 has one more
// exponent bit and 7 more mantissa bits than E4M3, and f16 subnormals are converted exactly: no
// f32 subnormal arises); times 2^7 is E4M3 / 2.
BW24_DEVICE float ue4m3_half(uint32_t x) {
    return __fmul_rn(__half2float(__ushort_as_half((unsigned short)(x << 7))), 128.0f);
}

// e8m0 exponent byte e -> 2^(e-127) / 2 (quants.e8m0_to_f32_half, ggml_e8m0_to_fp32_half): the
// float with biased exponent e - 1, or for e < 2 the subnormals 2^-128, 2^-127 (bit 21 + e)
BW24_DEVICE float e8m0_half(uint32_t e) { return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23); }

// per-chunk scale a0 (values 0-15 or all), a1 (values 16-31 for TWO_SCALES), additive b (b1:
// values 16-31's for TWO_MINS, else b)
BW24_DEVICE void chunk_scales(const Raw& r, int kc, float& a0, float& a1, float& b, float& b1) {
    a0 = 1.0f;
    a1 = 1.0f;
    b = 0.0f;
#if FMT == F_Q8_0 || FMT == F_Q4_0 || FMT == F_Q5_0
    a0 = f16_bits_to_f32((uint16_t)(r.s.x & 0xFFFFu));
#elif FMT == F_Q4_1 || FMT == F_Q5_1
    a0 = f16_bits_to_f32((uint16_t)(r.s.x & 0xFFFFu));
    b = f16_bits_to_f32((uint16_t)(r.s.x >> 16));
#elif FMT == F_Q4_K || FMT == F_Q5_K
    // quants.k_scale_min: bytes 4-7 scales (low 6 bits), 8-11 mins, 12-15 low nibbles of 4-7
    const int sub = kc & 7, j = sub & 3;
    const float d = f16_bits_to_f32((uint16_t)(r.s.x & 0xFFFFu));
    const float dmin = f16_bits_to_f32((uint16_t)(r.s.x >> 16));
    const uint32_t A = byte_of(r.s.y, j), Mb = byte_of(r.s.z, j), Hb = byte_of(r.s.w, j);
    uint32_t sc, mn;
    if (sub < 4) {
        sc = A & 63u;
        mn = Mb & 63u;
    } else {
        sc = (Hb & 0x0Fu) | ((A >> 2) & 0x30u);
        mn = (Hb >> 4) | ((Mb >> 2) & 0x30u);
    }
    a0 = __fmul_rn(d, (float)sc);
    b = -__fmul_rn(dmin, (float)mn);
#elif FMT == F_Q6_K || FMT == F_Q3_K
    const int sub = kc & 7;
    const float d = f16_bits_to_f32((uint16_t)r.d);
    const uint32_t sw = word_of(r.s, sub >> 1);  // scales 2*sub, 2*sub+1 = bytes (2*sub)&3, +1 of word sub>>1
    a0 = __fmul_rn(d, (float)(int)(int8_t)byte_of(sw, (2 * sub) & 3));
    a1 = __fmul_rn(d, (float)(int)(int8_t)byte_of(sw, ((2 * sub) & 3) + 1));
#elif FMT == F_NVFP4
    const int half = kc & 1;
    a0 = ue4m3_half(byte_of(r.s.x, 2 * half));
    a1 = ue4m3_half(byte_of(r.s.x, 2 * half + 1));
#elif FMT == F_MXFP4
    a0 = e8m0_half(r.s.x);
#elif FMT == F_Q2_K
    // quants._q2_k: dl = d * (byte & 15), ml = dmin * (byte >> 4) of sub-blocks 2 sub, 2 sub + 1
    const int sub = kc & 7;
    const float d = f16_bits_to_f32((uint16_t)(r.d & 0xFFFFu));
    const float dmin = f16_bits_to_f32((uint16_t)(r.d >> 16));
    const uint32_t sw = word_of(r.s, sub >> 1);
    const uint32_t s0 = byte_of(sw, (2 * sub) & 3), s1 = byte_of(sw, ((2 * sub) & 3) + 1);
    a0 = __fmul_rn(d, (float)(s0 & 15u));
    a1 = __fmul_rn(d, (float)(s1 & 15u));
    b = -__fmul_rn(dmin, (float)(s0 >> 4));
    b1 = -__fmul_rn(dmin, (float)(s1 >> 4));
#endif
#if !TWO_MINS
    b1 = b;
#endif
}
BW24_DEVICE void chunk_scales(const Raw& r, int kc, float& a0, float& a1, float& b) {
    float b1;
    chunk_scales(r, kc, a0, a1, b, b1);
    (void)b1;
}

BW24_DEVICE uint32_t shl_signed(uint32_t v, int s) { return s >= 0 ? v << s : v >> (-s); }

// nibble family: the code bytes of values 4g+j (lo) and 16+4g+j (hi), high bits merged in;
// 2-bit family: the same from the two code words; NVFP4 / MXFP4: the selector nibbles of those
// values (lo in bits 0-15; hi: the word shifted down)
BW24_DEVICE void qwords(const Raw& r, int g, uint32_t& lo, uint32_t& hi) {
#if E2M1_FMT
    const uint32_t w = word_of(r.q, g);
    lo = w;
    hi = w >> 16;
#elif Q2BIT
    lo = (r.q.x >> (2 * g)) & 0x03030303u;
    hi = (r.q.y >> (2 * g)) & 0x03030303u;
#if FMT == F_Q3_K
    lo |= shl_signed(r.h.x, 2 - g) & 0x04040404u;
    hi |= (r.h.x >> (g + 2)) & 0x04040404u;
#endif
#else
    const uint32_t w = word_of(r.q, g);
    lo = w & 0x0F0F0F0Fu;
    hi = (w >> 4) & 0x0F0F0F0Fu;
#if HAS_H5
    lo |= shl_signed(r.h.x, 4 - g) & 0x10101010u;
    hi |= (r.h.x >> g) & 0x10101010u;
#elif FMT == F_Q6_K
    lo |= shl_signed(r.h.x, 4 - 2 * g) & 0x30303030u;
    hi |= shl_signed(r.h.y, 4 - 2 * g) & 0x30303030u;
#endif
#endif
}

// byte j of a code word -> exact float of (code - QOFF) (not NVFP4 / MXFP4: their words are selectors)
BW24_DEVICE float qval(uint32_t w, int j) {
    return __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)j)), 8388608.0f + QOFF);
}

// NVFP4 / MXFP4, four codes as selector nibbles (bits 0-15, value j in nibble j; qwords) -> bytes
// (doubled E2M1 value + 12: 0..24), byte j = value j.  A 16-entry byte table looked up four
// codes at a time with PRMT (entries 0-7 and 8-15 from two register pairs, then picked by the
// code's sign bit).  Code 8 (-0) gives +0, as the reference table (E2M1_X2[8] = 0) does.
BW24_DEVICE uint32_t nvfp4_s4(uint32_t sel) {
    const uint32_t idx = sel & 0x7777u;  // __byte_perm uses 3 bits per nibble; masked to be explicit
    const uint32_t pos = __byte_perm(0x0F0E0D0Cu, 0x18141210u, idx);  // codes 0-7:  12 + {0,1,2,3,4,6,8,12}
    const uint32_t neg = __byte_perm(0x090A0B0Cu, 0x00040608u, idx);  // codes 8-15: 12 - {0,1,2,3,4,6,8,12}
    return __byte_perm(pos, neg, ((sel & 0x8888u) >> 1) | 0x3210u);
}

// the exact floats of the four codes (nvfp4_s4's bytes made floats by the 2^23 trick), in order
BW24_DEVICE void nvfp4_x4(uint32_t sel, float (&f)[4]) {
    const uint32_t e = nvfp4_s4(sel);
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = __fsub_rn(__uint_as_float(__byte_perm(e, 0x4B000000u, 0x7440u | (uint32_t)j)), 8388620.0f);
}

// the four exact code floats of a qwords() word, in order j = 0..3
BW24_DEVICE void qvals4(uint32_t t, float (&f)[4]) {
#if E2M1_FMT
    nvfp4_x4(t, f);
#else
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = qval(t, j);
#endif
}

BW24_DEVICE float wexact(float a, float q, float b) {
#if HAS_MIN
    return __fadd_rn(__fmul_rn(a, q), b);
#else
    (void)b;
    return __fmul_rn(a, q);
#endif
}

// float formats: value e (0..VPC-1) of the chunk
BW24_DEVICE float fval(const Raw& r, int e) {
#if FMT == F_F32
    return __uint_as_float(word_of(r.q, e));
#elif FMT == F_BF16
    const uint32_t w = word_of(r.q, e >> 1);
    return __uint_as_float((e & 1) ? (w & 0xFFFF0000u) : (w << 16));
#else
    const uint32_t w = word_of(r.q, e >> 1);
    return f16_bits_to_f32((uint16_t)((e & 1) ? (w >> 16) : (w & 0xFFFFu)));
#endif
}

#if VPC == 32
// values 16h .. 16h+15 of decode_exact(r, kc, v) (the 32-value quantized formats), the same bits:
// for kernels that take a chunk in halves, with half the decoded values live
BW24_DEVICE void decode_half(const Raw& r, int kc, int h, float (&v)[16]) {
    float a0, a1, b0, b1;
    chunk_scales(r, kc, a0, a1, b0, b1);
#if !TWO_SCALES
    a1 = a0;
#endif
    const float a = h ? a1 : a0, b = h ? b1 : b0;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        uint32_t lo, hi;
        qwords(r, g, lo, hi);
        float f[4];
        qvals4(h ? hi : lo, f);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[4 * g + j] = wexact(a, f[j], b);
    }
}
#endif

// the exact f32 values of chunk kc (bit-equal to quants.dequantize), natural order
BW24_DEVICE void decode_exact(const Raw& r, int kc, float* v) {
#if IS_FLOAT_FMT
    (void)kc;
#pragma unroll
    for (int e = 0; e < VPC; ++e) v[e] = fval(r, e);
#else
    float a0, a1, b, b1;
    chunk_scales(r, kc, a0, a1, b, b1);
#if FMT == F_Q8_0
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const uint32_t w = word_of(r.q, g) ^ 0x80808080u;  // int8 -> int8 + 128 as unsigned
#pragma unroll
        for (int j = 0; j < 4; ++j) v[4 * g + j] = __fmul_rn(qval(w, j), a0);
    }
#else
#if !TWO_SCALES
    a1 = a0;
#endif
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        uint32_t lo, hi;
        qwords(r, g, lo, hi);
        float fl[4], fh[4];
        qvals4(lo, fl);
        qvals4(hi, fh);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[4 * g + j] = wexact(a0, fl[j], b);
            v[16 + 4 * g + j] = wexact(a1, fh[j], b1);
        }
    }
#endif
#endif
}
