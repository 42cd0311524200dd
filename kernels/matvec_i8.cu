// matvec_i8.cu — the decode matvec of the integer-dot contract (ACT_Q8: Q8_0, Q4_K, Q5_K, Q6_K,
// NVFP4, MXFP4, Q2_K, Q3_K) on int8 tensor cores, for m = 2..8 tokens (speculative verify, batched decode).
// cuda_linear.matvec_impl picks it from MATVEC_ROWS_TUNING; one token runs matvec.cu's SIMT kernel.
//
// Contract: matvec.cu's integer-dot contract, bit for bit.  y[m, o] = gs[o] * sum over chunks and
// levels of (integer dot) * (weight scale * x scale), prologues none / rmsnorm / swiglu / qx
// (with PRO_BF16), epilogues store / add / swiglu, qx_out (the swiglu epilogue's x codes of the
// next matvec, from 64-row tiles); the x codes and records are staged by matvec_a8.cuh's stage_a8 /
// stage_qx, the same code as the SIMT kernel's.  So every output equals the SIMT kernel's (and
// so the one-token step's) bit for bit, for every m: row t of an m-row step is the one-row step.
// NumPy reference of the exact bits: kernel_refs.matvec_a8_exact.
//
// Exactness.  The SIMT kernel reduces output (o, m) as follows: lane L of the row's warp runs a
// chain over the chunks kc = L, L + 32, ... (increasing): per chunk it forms exact integer dots of
// the weight codes with the x code levels (dp4a), then one FMA per level (or half chunk) into an
// f32 accumulator starting at +0 (matvec_a8.cuh chunk_dot_a8: Q8_0 acc += s_p * (d * 2^e_p),
// p = h then l; NVFP4 acc += float(256 dot_h + dot_l) * (s * 2^(e-1)), values 0-15 then 16-31;
// MXFP4 acc += float(256 dot_h + dot_l) * (a * 2^(e-8)) over the whole chunk;
// Q4_K acc += float(256 dot_h + dot_l) * (a * 2^(e-8)), then acc += b * xsum; Q5_K per level
// acc += dot * (a * 2^e_p), acc += codesum * (b * 2^e_p); Q6_K / Q3_K per level the two halves'
// (dot - offset codesum) with their two scales, Q2_K then the halves' codesums with their two
// mins); then warp_sum, the xor tree over L (16, 8, 4, 2, 1);
// then gs and the epilogue.  The integer dots are exact in any order (|dot| < 2^22, |256 dot_h +
// dot_l| < 2^23), so a tensor core may form them: here mma.sync m16n8k32 (s8 x s8, or u8 codes x s8) forms, for 16
// rows, the dots of 4 chunks and both levels at once.  What must match is which chunks feed
// which f32 chain, in which order, and the tree: lane t (t = lane % 4) of the warp takes chunk
// 4 ss + t of super-step ss, and warp kg of a 16-row tile takes the super-steps ss = kg,
// kg + I8_KW, ...; so its chunks are kc = 4 (ss mod 8) + t + 32 j: the SIMT lane L = 4 (ss mod
// 8) + t's chunks, in the same order.  A warp covering several residues ss mod 8 (I8_KW < 8)
// keeps one chain per residue (I8_NA of them).  At the end of a tile each warp folds its own
// chains by the tree's levels whose pairs it holds (16: residues r, r + 4; 8: r, r + 2; ...), the
// rest of the tree runs over shared memory in the xor order, and gs and the epilogue follow as in
// matvec.cu.  The f32 operations per chain are the SIMT kernel's, the same instructions
// (__fmaf_rn, __fmul_rn, small_int_float / __int2float_rn: exact conversions): the same bits.
//
// Fragments (PTX ISA, mma.m16n8k32 .s8 / .u8): lane (g = lane / 4, t) holds A rows g and g + 8 at
// k-slots 4t..4t+3 (a0 / a1) and 16+4t..16+4t+3 (a2 / a3), B column g at the same k-slots (b0 /
// b1), C rows g (c0, c1) and g + 8 (c2, c3) at columns 2t, 2t + 1.  A: lane t's own chunk's code
// words (the SIMT kernel's dp4a operands: Q8_0 the int8 codes; the 4-bit family qwords() low words
// 0-3 (values 0-15), then high words 0-3 (16-31); NVFP4 / MXFP4 the doubled E2M1 values as int8), k-step s
// taking words 2s, 2s + 1.  B column n = 2q + p: level p of chunk 4 ss + q, carried in lane t = q
// only (zero elsewhere), the staged x words that pair with those code words.  So C[row][2q + p] is
// the exact dot of chunk 4 ss + q with level p, and it lands in lane t = q: the lane that loaded
// that chunk and its scales.  (Three quarters of each MMA's products are zeros: the tensor cores
// have the room; what they save is the SIMT kernel's dp4a issue and its shared-memory x reads.)
//
// Napkin math (Qwen3-8B shapes, H100 SXM: ~3.0 TB/s copy, 132 SMs at ~1.75 GHz: ~13 bytes per
// cycle per SM).  A warp's super-step reads 16 rows x 4 chunks: Q8_0 1.1 KB, NVFP4 / Q4_K 1.15 KB,
// Q5_K 1.4 KB, Q6_K 1.7 KB: ~85 cycles of one SM's share of the bandwidth at NVFP4.  Per token it
// costs 2 (Q8_0) or 4 MMAs (4-bit) of 4096 int8 MACs; at an assumed one mma.sync m16n8k32 per 2
// cycles per SM (half the int8 wgmma rate) the tensor cores are busy ~64 of those 85 cycles at
// m = 8 (4-bit), ~32 (Q8_0): within the weight stream up to m = 8.  Issue per token and
// super-step: 1-2 shared loads of x words (8 lanes), 1-2 of records, the MMAs and the f32 chain
// steps (2 rows x 2 levels or halves x convert, scale, FMA): ~15-25 warp instructions, against the
// SIMT kernel's ~28 (Q8_0) to ~48 (NVFP4) for the same weights, whose x words it reads from
// shared memory once per row pair and token (~2.5 KB per token and super-step: at m = 8 about
// twice an SM's shared-memory bandwidth at the weight rate); here ~0.3 KB.  The per-weight work
// (loads, decoding, scales) stays once per step, as at m = 1, so an m-row step should cost about
// the one-row step plus ~half the SIMT kernel's per-token increment (bw24chat bench: rows
// step{m}@512).  Not changed: every block stages all m rows of x (the prologue), and
// the f32 chain steps per token are the contract's.
//
// Geometry: a block of MV_NW = I8_KW * I8_ST warps takes passes of 16 * I8_ST rows (I8_ST
// sub-tiles of 16 rows, I8_KW warps each: split K by super-step residue) and tiles of I8_PH
// passes in turn (I8_ROWS rows: 64 for qx_out, whose block is a tile's 32 outputs); persistent
// as matvec.cu (block b takes tiles b, b + gridDim.x, ...); each warp keeps I8_U super-steps in
// flight (rolling window; the next pass's first window goes out before this pass's reduction).
// The rmsnorm statistic is the 8-warp kernel's (MV_STAT8 in 16-warp blocks).  Dynamic shared
// memory: the staged x (3 n_in bytes per token: matvec.cu ACT_Q8), MV_NW floats, the chains of
// one row per lane (MV_NW * MV_M * 32 floats) and, with qx_out, MV_M * 32 floats
// (cuda_linear._i8_row_bytes): a 12288-input down projection stages 6 tokens in 227 KB.
#ifndef I8_KW  // warps per 16-row sub-tile (split K by super-step residue mod 8): 1, 2, 4 or 8
#define I8_KW 8
#endif
#ifndef I8_ST  // 16-row sub-tiles per block tile
#define I8_ST 1
#endif
#ifndef I8_U  // super-steps per warp in flight (a multiple of I8_NA)
#define I8_U 3
#endif
#ifndef I8_PH  // passes per block tile: a tile of I8_PH * 16 * I8_ST rows, its passes in turn
#define I8_PH 1
#endif
#define MV_NW (I8_KW * I8_ST)
#define MV_STAT8 (MV_NW == 16)  // the rmsnorm statistic of 8 warps, in the 8-warp order
#ifndef MV_MINB  // blocks per SM the register budget must allow (cuda_linear.MATVEC_ROWS_TUNING)
#define MV_MINB 1
#endif
#define ACT_Q8 1
#include "matvec_common.cuh"
#include "matvec_a8.cuh"

#if IS_FLOAT_FMT || !(FMT == F_Q8_0 || FMT == F_Q4_K || FMT == F_Q5_K || FMT == F_Q6_K || E2M1_FMT || Q2BIT)
#error "matvec_i8: the integer-dot formats (Q8_0, Q4_K, Q5_K, Q6_K, NVFP4, MXFP4, Q2_K, Q3_K)"
#endif
#define I8_NA (8 / I8_KW)  // chains per lane and row: the warp's super-step residues mod 8
#define I8_UNIT (16 * I8_ST)      // rows per pass
#define I8_ROWS (I8_UNIT * I8_PH)  // rows per tile
#define I8_WORDS (VPC / 4)  // A code words per row and chunk (two per k-step)
static_assert(I8_KW == 1 || I8_KW == 2 || I8_KW == 4 || I8_KW == 8, "I8_KW: 1, 2, 4 or 8 warps per sub-tile");
static_assert(I8_U % I8_NA == 0, "I8_U: a multiple of the residues per warp (chain index known per slot)");
#define I8_SIGNED_A (FMT == F_Q8_0 || E2M1_FMT)  // int8 weight values; the rest unsigned codes

BW24_DEVICE void mma_i8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if I8_SIGNED_A
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The A code words of one row's chunk in k-slot order: the SIMT kernel's dp4a operands (E2M1:
// nvfp4_weight_bytes' offset bytes made signed, doubled value = byte - 128 = byte ^ 0x80)
BW24_DEVICE void i8_awords(const Raw& r, uint32_t nv_t0, uint32_t (&w)[I8_WORDS]) {
#if FMT == F_Q8_0
    (void)nv_t0;
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = word_of(r.q, i);
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if E2M1_FMT
        nvfp4_weight_bytes(word_of(r.q, i), nv_t0, w[i], w[4 + i]);
        w[i] ^= 0x80808080u;
        w[4 + i] ^= 0x80808080u;
#else
        (void)nv_t0;
        qwords(r, i, w[i], w[4 + i]);
#endif
    }
#endif
}

// One super-step of one 16-row sub-tile: this lane's chunk kc = 4 ss + t of rows g, g + 8 (cur)
// against the MV_M staged tokens; acc[m][i]: the chain of row g + 8 i.  The f32 steps per row and
// token are chunk_dot_a8's, in its order.
BW24_DEVICE void i8_step(const Raw (&cur)[2], int kc, int nck, const uint32_t* xw, int wpm, const uint4* meta, int nb,
                         uint32_t nv_t0, float (&acc)[MV_M][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool own = kc < nck;               // the chunk exists: its dots feed this lane's chains
    const bool bsel = own && t == (g >> 1);  // this lane carries B column g = 2t + p
    const int pb = g & 1;
    uint32_t aw[2][I8_WORDS];
    float a0[2], a1[2], b[2], b1[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        i8_awords(cur[i], nv_t0, aw[i]);
#if FMT == F_NVFP4
        nvfp4_scales_f16(cur[i].s.x, kc, a0[i], a1[i]);  // E4M3 * 2^-8 (the x record holds 2^(e-1))
        b[i] = b1[i] = 0.0f;
#else
        chunk_scales(cur[i], kc, a0[i], a1[i], b[i], b1[i]);
#endif
    }
    const int blk = VPC == 16 ? kc >> 1 : kc;  // the chunk's 32-input activation block
#pragma unroll
    for (int m = 0; m < MV_M; ++m) {
        // B: level pb of token m at this lane's chunk (the lanes with t = g / 2), staged as in matvec.cu
        const uint32_t* xp = xw + (2 * m + pb) * wpm;
        uint32_t bw[I8_WORDS];
        uint4 xl = make_uint4(0u, 0u, 0u, 0u);
        if (bsel) xl = *reinterpret_cast<const uint4*>(xp + 4 * kc);
        bw[0] = xl.x; bw[1] = xl.y; bw[2] = xl.z; bw[3] = xl.w;
#if VPC == 32  // values 16-31 of the chunk at words 4 (nck + kc).. (matvec_a8.cuh a8_word)
        uint4 xh = make_uint4(0u, 0u, 0u, 0u);
        if (bsel) xh = *reinterpret_cast<const uint4*>(xp + 4 * (nck + kc));
        bw[4] = xh.x; bw[5] = xh.y; bw[6] = xh.z; bw[7] = xh.w;
#endif
        // the records of this lane's chunk (A8_JOIN: one per block, in level h's place)
        uint4 mt[2] = {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u)};
        if (own) {
            mt[0] = meta[2 * m * nb + blk];
#if !A8_JOIN
            mt[1] = meta[(2 * m + 1) * nb + blk];
#endif
        }
        // C: (c[0], c[1]) = row g's dots with levels h, l; (c[2], c[3]) row g + 8's
#if TWO_SCALES  // values 0-15 (k-steps 0, 1) and 16-31 (2, 3) apart; Q6_K's / Q3_K's code offset in the seeds
        int clo[4], chi[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            clo[j] = -A8_OFF * (int)mt[j & 1].y;
            chi[j] = -A8_OFF * (int)mt[j & 1].z;
        }
        mma_i8(clo, aw[0][0], aw[1][0], aw[0][1], aw[1][1], bw[0], bw[1]);
        mma_i8(clo, aw[0][2], aw[1][2], aw[0][3], aw[1][3], bw[2], bw[3]);
        mma_i8(chi, aw[0][4], aw[1][4], aw[0][5], aw[1][5], bw[4], bw[5]);
        mma_i8(chi, aw[0][6], aw[1][6], aw[0][7], aw[1][7], bw[6], bw[7]);
#else
        int c[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < I8_WORDS / 2; ++s) mma_i8(c, aw[0][2 * s], aw[1][2 * s], aw[0][2 * s + 1], aw[1][2 * s + 1], bw[2 * s], bw[2 * s + 1]);
#endif
        if (!own) continue;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#if FMT == F_NVFP4
            const float dx = __uint_as_float(mt[0].x);
            acc[m][i] = __fmaf_rn(__int2float_rn(clo[2 * i] * 256 + clo[2 * i + 1]), __fmul_rn(a0[i], dx), acc[m][i]);
            acc[m][i] = __fmaf_rn(__int2float_rn(chi[2 * i] * 256 + chi[2 * i + 1]), __fmul_rn(a1[i], dx), acc[m][i]);
#elif FMT == F_Q4_K || FMT == F_MXFP4
            const float dx = __uint_as_float(mt[0].x);
            acc[m][i] = __fmaf_rn(__int2float_rn(c[2 * i] * 256 + c[2 * i + 1]), __fmul_rn(a0[i], dx), acc[m][i]);
#if FMT == F_Q4_K
            acc[m][i] = __fmaf_rn(b[i], __uint_as_float(mt[0].w), acc[m][i]);  // the record's exact x sum
#endif
#else
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const float dx = __uint_as_float(mt[p].x);
#if TWO_SCALES  // Q6_K, Q3_K, Q2_K
                acc[m][i] = __fmaf_rn(small_int_float(clo[2 * i + p]), __fmul_rn(a0[i], dx), acc[m][i]);
                acc[m][i] = __fmaf_rn(small_int_float(chi[2 * i + p]), __fmul_rn(a1[i], dx), acc[m][i]);
#if TWO_MINS  // Q2_K: the halves' code sums with their mins
                acc[m][i] = __fmaf_rn(small_int_float((int)mt[p].y), __fmul_rn(b[i], dx), acc[m][i]);
                acc[m][i] = __fmaf_rn(small_int_float((int)mt[p].z), __fmul_rn(b1[i], dx), acc[m][i]);
#endif
#else
                acc[m][i] = __fmaf_rn(small_int_float(c[2 * i + p]), __fmul_rn(a0[i], dx), acc[m][i]);
#if HAS_MIN  // Q5_K
                acc[m][i] = __fmaf_rn(small_int_float((int)mt[p].w), __fmul_rn(b[i], dx), acc[m][i]);
#endif
#endif
            }
#endif
        }
    }
    (void)a1; (void)b; (void)b1;
}

extern "C" __global__ void __launch_bounds__(MV_NT, MV_MINB)
matvec_i8(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
          const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
          float* __restrict__ out, const float* __restrict__ normw, int n_out, int n_in, int ldx, int pro, int epi,
          float eps, const uint32_t* __restrict__ qx_in, uint32_t* __restrict__ qx_out) {
    extern __shared__ float4 smem4[];
    const int wpm = n_in / 4, nb = n_in / 32;
    uint32_t* xw = reinterpret_cast<uint32_t*>(smem4);            // [MV_M][2][n_in/4] code words
    uint4* meta = reinterpret_cast<uint4*>(xw + 2 * MV_M * wpm);  // [MV_M][2][n_in/32] block records
    float* red = reinterpret_cast<float*>(meta + 2 * MV_M * nb);  // [MV_NW] the statistic's warp sums
    float* chains = red + MV_NW;                                  // [MV_NW][MV_M][32] the warps' chains of one row
    float* qxs = chains + MV_NW * MV_M * 32;                      // [MV_M][32] qx_out's tile outputs
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int st = warp / I8_KW, kg = warp - st * I8_KW;
    const bool xb16 = (pro & PRO_BF16) != 0;
    pro &= ~PRO_BF16;
    const int nck = n_in / VPC, nss = (nck + 3) / 4;
    const int ntiles = (n_out + I8_ROWS - 1) / I8_ROWS;
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    int ph = 0;    // the pass of the tile
    long rows[2];  // this lane's rows g, g + 8 of its sub-tile
    auto set_rows = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i) rows[i] = min((long)tile * I8_ROWS + ph * I8_UNIT + 16 * st + g + 8 * i, (long)n_out - 1);
    };
    Raw raw[I8_U][2];
#pragma unroll
    for (int u = 0; u < I8_U; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i) raw[u][i] = Raw{};  // a slot past the row keeps old codes: B is zero there
    auto fetch = [&](int u, int ss) {
        const int kc = 4 * ss + t;
        if (ss < nss && kc < nck)
#pragma unroll
            for (int i = 0; i < 2; ++i) fetch_chunk(raw[u][i], wq, wh, ws, wd, rows[i], nck, kc);
    };
    set_rows();
    // the first window goes out before the prologue (its latency overlaps the x staging)
#pragma unroll
    for (int u = 0; u < I8_U; ++u) fetch(u, kg + I8_KW * u);
    pdl_wait();  // x (and out, for the add epilogue) come from the previous kernel

    if (pro == PRO_QX)
        stage_qx(qx_in, n_in, xw, meta);
    else
        stage_a8(x, ldx, n_in, pro, eps, normw, xb16, xw, meta, red);
    __syncthreads();
    // the E2M1 table word in a vector register (matvec.cu: not provably uniform, so not re-materialized)
    const uint32_t nv_t0 = __shfl_sync(0xffffffffu, 0x03020100u + (uint32_t)lane, lane) - (uint32_t)lane;

    for (;;) {
        float acc[I8_NA][MV_M][2];
#pragma unroll
        for (int a = 0; a < I8_NA; ++a)
#pragma unroll
            for (int m = 0; m < MV_M; ++m) acc[a][m][0] = acc[a][m][1] = 0.0f;
        // this warp's super-steps ss = kg + I8_KW j in increasing order; slot u = j % I8_U is refilled
        // with step j + I8_U as soon as step j is consumed; chain j % I8_NA = the residue's
        for (int j0 = 0; kg + I8_KW * j0 < nss; j0 += I8_U) {
#pragma unroll
            for (int u = 0; u < I8_U; ++u) {
                const int ss = kg + I8_KW * (j0 + u);
                if (ss >= nss) break;  // warp-uniform
                const Raw cur[2] = {raw[u][0], raw[u][1]};
                fetch(u, ss + I8_KW * I8_U);
                i8_step(cur, 4 * ss + t, nck, xw, wpm, meta, nb, nv_t0, acc[u % I8_NA]);
            }
        }

        // the next pass's first window goes out before this pass's reduction and stores
        const long row0 = (long)tile * I8_ROWS + ph * I8_UNIT;
        const int this_tile = tile, this_ph = ph;
        if (++ph == I8_PH) {
            ph = 0;
            tile += gridDim.x;
        }
        if (tile < ntiles) {
            set_rows();
#pragma unroll
            for (int u = 0; u < I8_U; ++u) fetch(u, kg + I8_KW * u);
        } else {
            pdl_trigger();  // this block's weight stream is done: the next kernel may start its loads
        }

        // The xor tree of warp_sum over the 32 chains L = 4 (residue) + t: first the levels whose
        // pairs this warp holds (residues r, r + 4 are chains a, a + I8_NA / 2; r, r + 2 a, a +
        // I8_NA / 4; ...), then, over shared memory, the levels o = 2 I8_KW, ..., 1 on the
        // remaining leaves L = 4 kg + t (kg < I8_KW); rows g (i = 0), then g + 8 (i = 1), so the
        // buffer holds one row of each lane's two.
#pragma unroll
        for (int o = I8_NA / 2; o >= 1; o >>= 1)
#pragma unroll
            for (int a = 0; a < o; ++a)
#pragma unroll
                for (int m = 0; m < MV_M; ++m)
#pragma unroll
                    for (int i = 0; i < 2; ++i) acc[a][m][i] = __fadd_rn(acc[a][m][i], acc[a + o][m][i]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            __syncthreads();  // the previous round's outputs have read the chains
#pragma unroll
            for (int m = 0; m < MV_M; ++m) chains[(warp * MV_M + m) * 32 + lane] = acc[0][m][i];
            __syncthreads();
            // row 16 sr + 8 i + rg of the pass (sub-tile sr), token m: the rest of the tree, then gs
            auto row_value = [&](int sr, int rg, int m) {
                float v[4 * I8_KW];
#pragma unroll
                for (int k = 0; k < I8_KW; ++k) {
                    const float4 q = *reinterpret_cast<const float4*>(chains + ((sr * I8_KW + k) * MV_M + m) * 32 + 4 * rg);
                    v[4 * k] = q.x; v[4 * k + 1] = q.y; v[4 * k + 2] = q.z; v[4 * k + 3] = q.w;
                }
#pragma unroll
                for (int o = 2 * I8_KW; o >= 1; o >>= 1)
#pragma unroll
                    for (int L = 0; L < o; ++L) v[L] = __fadd_rn(v[L], v[L + o]);
                const long o = row0 + 16 * sr + 8 * i + rg;
                return gscale && o < n_out ? __fmul_rn(v[0], gscale[o]) : v[0];
            };
            if (epi == EPI_SWIGLU) {  // rows (2j, 2j+1) = (gate_j, up_j) -> out[m, j], row stride n_out/2
                for (int it = tid; it < 4 * I8_ST * MV_M; it += MV_NT) {
                    const int pr = it / MV_M, m = it - pr * MV_M, sr = pr >> 2, rg = 2 * (pr & 3);
                    const int r = 16 * sr + 8 * i + rg;  // the pass's row of the gate
                    if (row0 + r + 1 >= n_out) continue;
                    const float a = swiglu_act(row_value(sr, rg, m), row_value(sr, rg + 1, m));
                    out[(long)m * (n_out >> 1) + ((row0 + r) >> 1)] = a;
                    if (qx_out) qxs[m * 32 + ((this_ph * I8_UNIT + r) >> 1)] = xb16 ? bf16_round(a) : a;
                }
            } else {
                for (int it = tid; it < 8 * I8_ST * MV_M; it += MV_NT) {
                    const int rr = it / MV_M, m = it - rr * MV_M, sr = rr >> 3, rg = rr & 7;
                    const long o = row0 + 16 * sr + 8 * i + rg;
                    if (o >= n_out) continue;
                    const float v = row_value(sr, rg, m);
                    float* dst = out + (long)m * n_out + o;
                    *dst = epi == EPI_ADD ? __fadd_rn(*dst, v) : v;
                }
            }
        }
        // qx_out (64-row tiles: the wrapper checks): after its last pass the tile's 32 outputs are
        // block this_tile of the next matvec's x, quantized by warp 0 (qxs is rewritten only after
        // the next pass's barriers, which warp 0 reaches after this)
        if (qx_out && epi == EPI_SWIGLU && this_ph == I8_PH - 1) {
            __syncthreads();
            if (warp == 0) qx_write_tile(qx_out, n_out >> 1, this_tile, qxs);
        }
        if (tile >= ntiles) break;
    }
}
