// repack.cu — a matrix's blocks as the GGUF / converted checkpoint holds them, rearranged on the
// GPU into the resident planes the kernels read (kernels/formats.cuh): the expert file tier's
// images (backends/cuda_tiers.py), built where they are used instead of on the host.
//
// Contract
//   repack_blocks(raw, rows, nb, raw_row_bytes, q, h, s, d, gscale, gs, row_mul, row_add)
//     raw: rows x raw_row_bytes bytes, row r = nb blocks of the format's TS bytes (float formats:
//     16-byte chunks); source row r becomes plane row o = r * row_mul + row_add (gate|up
//     interleaved: row_mul 2, row_add the tensor's index; concatenated: 1, its first row);
//     q / h / s / d: the planes (row o at o * nb * X_PB bytes, X_PB a plane's bytes per block,
//     null where the format has none), gscale (NVFP4, may be null): float32 per plane row, = gs.
//   The bytes are cuda_weights.repack_one's (and repack_host's join) exactly; NumPy reference:
//   cuda_weights.repack_host (ExpertSource.image places its planes); GPU test: tests/gpu/test_repack.py.
// Launch: 1-D grid-stride over the rows x nb blocks, 256 threads, one block per thread-iteration.
// Napkin math: a Qwen3-30B-A3B Q8_0 expert is 5.0 MB in and out: ~4 us of HBM at 3 TB/s, against
// the ~0.3 ms its raw bytes take over PCIe; byte loads and stores are fine at that ratio (the
// host repack it replaces took 1-64 ms per expert, the most in NumPy's bit packing).
#include "common.cuh"
#include "formats.cuh"

#if FMT == F_F32 || FMT == F_F16 || FMT == F_BF16
#define TS 16
#define Q_PB 16
#elif FMT == F_Q8_0
#define TS 34
#define Q_PB 32
#elif FMT == F_Q4_0
#define TS 18
#define Q_PB 16
#elif FMT == F_Q4_1
#define TS 20
#define Q_PB 16
#elif FMT == F_Q5_0
#define TS 22
#define Q_PB 16
#elif FMT == F_Q5_1
#define TS 24
#define Q_PB 16
#elif FMT == F_Q4_K
#define TS 144
#define Q_PB 128
#elif FMT == F_Q5_K
#define TS 176
#define Q_PB 128
#elif FMT == F_Q6_K
#define TS 210
#define Q_PB 128
#elif FMT == F_NVFP4
#define TS 36
#define Q_PB 32
#elif FMT == F_MXFP4
#define TS 17
#define Q_PB 16
#elif FMT == F_Q2_K
#define TS 84
#define Q_PB 64
#elif FMT == F_Q3_K
#define TS 110
#define Q_PB 64
#endif
// the other planes' bytes per block (0: none)
#if FMT == F_Q5_0 || FMT == F_Q5_1
#define H_PB 4
#elif FMT == F_Q5_K || FMT == F_Q3_K
#define H_PB 32
#elif FMT == F_Q6_K
#define H_PB 64
#else
#define H_PB 0
#endif
#if FMT == F_Q8_0 || FMT == F_Q4_0 || FMT == F_Q5_0
#define S_PB 2
#elif FMT == F_Q4_1 || FMT == F_Q5_1 || FMT == F_NVFP4
#define S_PB 4
#elif FMT == F_MXFP4
#define S_PB 1
#elif FMT == F_Q4_K || FMT == F_Q5_K || FMT == F_Q6_K || FMT == F_Q2_K || FMT == F_Q3_K
#define S_PB 16
#else
#define S_PB 0
#endif
#if FMT == F_Q6_K || FMT == F_Q3_K
#define D_PB 2
#elif FMT == F_Q2_K
#define D_PB 4
#else
#define D_PB 0
#endif

BW24_DEVICE void put_u32(uint8_t* p, uint32_t w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(w >> (8 * i));
}

// cuda_weights.pack_h5: 32 one-bit fields -> u32, bit 8j+g = value 4g+j, bit 8j+4+g = value 16+4g+j
template <class Bit>
BW24_DEVICE uint32_t pack_h5(Bit bit) {
    uint32_t w = 0;
#pragma unroll
    for (int v = 0; v < 16; ++v) {
        const int g = v >> 2, j = v & 3;
        w |= (uint32_t)bit(v) << (8 * j + g);
        w |= (uint32_t)bit(16 + v) << (8 * j + 4 + g);
    }
    return w;
}

// cuda_weights.pack_h6: 32 two-bit fields -> 2 x u32, word0 bits 8j+2g.. = value 4g+j, word1 of 16+4g+j
template <class Two>
BW24_DEVICE void pack_h6(uint8_t* p, Two two) {
    uint32_t w0 = 0, w1 = 0;
#pragma unroll
    for (int v = 0; v < 16; ++v) {
        const int g = v >> 2, j = v & 3;
        w0 |= (uint32_t)two(v) << (8 * j + 2 * g);
        w1 |= (uint32_t)two(16 + v) << (8 * j + 2 * g);
    }
    put_u32(p, w0);
    put_u32(p + 4, w1);
}

// cuda_weights.pack_nibbles: 32 codes -> 16 bytes, byte j = code j | code 16+j << 4
template <class Code>
BW24_DEVICE void pack_nibbles(uint8_t* p, Code code) {
#pragma unroll
    for (int j = 0; j < 16; ++j) p[j] = (uint8_t)((code(j) & 15) | (code(16 + j) & 15) << 4);
}

// cuda_weights.pack_selector_words: 32 E2M1 codes -> 4 u32, word g = codes 4g+j at bits 4j, codes
// 16+4g+j at bits 16+4j
template <class Code>
BW24_DEVICE void pack_selector_words(uint8_t* p, Code code) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        uint32_t w = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) w |= (uint32_t)(code(4 * g + j) & 15) << (4 * j) | (uint32_t)(code(16 + 4 * g + j) & 15) << (16 + 4 * j);
        put_u32(p + 4 * g, w);
    }
}

BW24_DEVICE void copy_bytes(uint8_t* dst, const uint8_t* src, int n) {
    for (int i = 0; i < n; ++i) dst[i] = src[i];
}

extern "C" __global__ void __launch_bounds__(256)
repack_blocks(const uint8_t* __restrict__ raw, int rows, int nb, long raw_row_bytes, uint8_t* __restrict__ q,
              uint8_t* __restrict__ h, uint8_t* __restrict__ s, uint8_t* __restrict__ d, float* __restrict__ gscale,
              float gs, int row_mul, int row_add) {
    pdl_wait();  // no early trigger: a kernel after it on the stream may read the planes before its own wait
    const long total = (long)rows * nb;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long r = i / nb;
        const int b = (int)(i - r * nb);
        const long o = r * row_mul + row_add;
        const uint8_t* x = raw + r * raw_row_bytes + (long)b * TS;
        uint8_t* qo = q + (o * nb + b) * Q_PB;
        (void)h; (void)s; (void)d; (void)gscale; (void)gs;
#if H_PB
        uint8_t* ho = h + (o * nb + b) * H_PB;
#endif
#if S_PB
        uint8_t* so = s + (o * nb + b) * S_PB;
#endif
#if D_PB
        uint8_t* dO = d + (o * nb + b) * D_PB;
#endif
#if FMT == F_F32 || FMT == F_F16 || FMT == F_BF16
        copy_bytes(qo, x, 16);
#elif FMT == F_Q8_0 || FMT == F_Q4_0 || FMT == F_Q4_1  // cuda_weights.BLOCK_FIELDS: the scales, then the codes
        copy_bytes(so, x, S_PB);
        copy_bytes(qo, x + S_PB, Q_PB);
#elif FMT == F_Q5_0 || FMT == F_Q5_1  // scale record, 32 fifth bits (u32), 16 nibble bytes
        copy_bytes(so, x, S_PB);
        const uint32_t qh = (uint32_t)x[S_PB] | (uint32_t)x[S_PB + 1] << 8 | (uint32_t)x[S_PB + 2] << 16 | (uint32_t)x[S_PB + 3] << 24;
        put_u32(ho, pack_h5([&](int v) { return (qh >> v) & 1u; }));
        copy_bytes(qo, x + S_PB + 4, 16);
#elif FMT == F_Q4_K || FMT == F_Q5_K  // sub-block sb = 2g + n: nibble n of code bytes 32g..32g+31
        copy_bytes(so, x, 16);
        const int off = FMT == F_Q4_K ? 16 : 48;
#pragma unroll 1
        for (int sb = 0; sb < 8; ++sb) {
            const uint8_t* c = x + off + 32 * (sb >> 1);
            const int sh = 4 * (sb & 1);
            pack_nibbles(qo + 16 * sb, [&](int l) { return c[l] >> sh; });
#if FMT == F_Q5_K  // the fifth bit of value l of sub-block sb: bit sb of qh byte l
            put_u32(ho + 4 * sb, pack_h5([&](int l) { return (uint32_t)(x[16 + l] >> sb) & 1u; }));
#endif
        }
#elif FMT == F_Q6_K  // ql 128, qh 64, scales 16, d 2; sub-block sb: lows of ql half sb/4, highs of qh
#pragma unroll 1
        for (int sb = 0; sb < 8; ++sb) {
            const uint8_t* lo = x + 64 * (sb >> 2) + 32 * (sb & 1);
            const int lsh = 4 * ((sb >> 1) & 1);
            pack_nibbles(qo + 16 * sb, [&](int l) { return lo[l] >> lsh; });
            const uint8_t* hi = x + 128 + 32 * (sb >> 2);
            const int hsh = 2 * (sb & 3);
            pack_h6(ho + 8 * sb, [&](int l) { return (uint32_t)(hi[l] >> hsh) & 3u; });
        }
        copy_bytes(so, x + 192, 16);
        copy_bytes(dO, x + 208, 2);
#elif FMT == F_Q2_K || FMT == F_Q3_K  // value 128h + 32s + l: bits 2s of code byte 32h + l (quants._q2_k)
        const int off = FMT == F_Q2_K ? 16 : 32;
#pragma unroll 1
        for (int sb = 0; sb < 8; ++sb) {
            const uint8_t* c = x + off + 32 * (sb >> 2);
            const int sh = 2 * (sb & 3);
            pack_h6(qo + 8 * sb, [&](int l) { return (uint32_t)(c[l] >> sh) & 3u; });
#if FMT == F_Q3_K  // the high bit of value l of sub-block sb: bit sb of mask byte l
            put_u32(ho + 4 * sb, pack_h5([&](int l) { return (uint32_t)(x[l] >> sb) & 1u; }));
#endif
        }
#if FMT == F_Q2_K
        copy_bytes(so, x, 16);
        copy_bytes(dO, x + 80, 4);
#else  // quants.q3_k_scales: 16 six-bit scales - 32, as int8 bytes
        for (int k = 0; k < 16; ++k) {
            const int lo = (x[96 + (k & 7)] >> (4 * (k >> 3))) & 15, hi = (x[104 + (k & 3)] >> (2 * (k >> 2))) & 3;
            so[k] = (uint8_t)((lo | hi << 4) - 32);
        }
        copy_bytes(dO, x + 108, 2);
#endif
#elif FMT == F_NVFP4  // 4 ue4m3 scales (cuda_weights.nvfp4_scale_bytes), 32 code bytes: group g4 of 8 bytes, lows then highs
        for (int k = 0; k < 4; ++k) so[k] = x[k] == 0x7F ? 0 : (x[k] & 0x7F);
#pragma unroll 1
        for (int c = 0; c < 2; ++c)
            pack_selector_words(qo + 16 * c, [&](int v) {
                const uint8_t* g = x + 4 + 8 * (2 * c + (v >> 4));
                const int t = v & 15;
                return t < 8 ? g[t] & 15 : g[t - 8] >> 4;
            });
        if (gscale && b == 0) gscale[o] = gs;
#elif FMT == F_MXFP4  // e8m0 byte, 16 code bytes: lows are values 0..15, highs 16..31
        so[0] = x[0];
        pack_selector_words(qo, [&](int v) { return v < 16 ? x[1 + v] & 15 : x[1 + v - 16] >> 4; });
#endif
    }
}
