// matvec_mma.cu — the decode matvec of the integer-dot contract (ACT_Q8) on int8 tensor cores for
// m = 1..16 tokens: the K + 1 rows of a speculative verify and the rows of a batched decode read
// each weight once, and the integer dots of all m tokens come from one MMA per 16 rows and 16
// inputs.  Formats Q8_0, NVFP4, Q4_K.  cuda_linear.matvec(impl="mma") launches it.
//
// Contract: matvec.cu's integer-dot contract, bit for bit — the rows equal the SIMT kernel's
// (matvec.cu ACT_Q8) at every MV_M, so row t of an m-row step equals the one-row step: prologues
// none / rmsnorm / swiglu / qx (with PRO_BF16), epilogues store / add / swiglu, qx_out (64-row
// tiles).  x is staged by the SIMT kernel's own code (matvec_a8.cuh stage_a8, stage_qx; dot_a8.cuh
// a8_stage_group: the same codes and scales) into this kernel's layout (MmaPlanes, the sink).
// NumPy: kernel_refs.matvec_a8_exact (the contract's bits), kernel_refs.matvec_a8_mma_order (this
// kernel's schedule, equal to it).
//
// The f32 operations per output (o, m), which the SIMT kernel performs and this one repeats:
//   chain L (L = 0..31, the SIMT lane) runs over the chunks kc = L, L + 32, ... in increasing
//   order, from +0, one step per chunk (VPC values; dot_a8.cuh chunk_dot_a8):
//     Q8_0   acc = fma(float(D_h), d * 2^e, acc); acc = fma(float(D_l), d * 2^(e-8), acc)
//     NVFP4  per half h = 0, 1 (values 16h..16h+15): acc = fma(float(256 D_h + D_l), s_h * 2^(e-1), acc)
//     Q4_K   acc = fma(float(256 D_h + D_l), a * 2^(e-8), acc); acc = fma(b, xsum, acc)
//   with D_p the exact int32 dot of the chunk's (or half's) weight integers (Q8_0 int8 codes,
//   NVFP4 doubled E2M1 values, Q4_K 4-bit codes) with x's code level p (h, l) of token m, the
//   scale products by __fmul_rn (d, s_h = E4M3 * 2^-8, a = d * sc, b = -dmin * mn: formats.cuh
//   chunk_scales, dot_a8.cuh nvfp4_scales_f16; 2^e, xsum: the staged record of the chunk's 32-input
//   block); then y = the xor tree of warp_sum over L (levels 16, 8, 4, 2, 1: v[L] += v[L + o]
//   for L < o); NVFP4 y *= gs[o]; the epilogue.  MV_NW, MV_R, MV_U, MV_STEADY, tk and the grid
//   of the SIMT kernel change none of this (matvec.cu: exactness); its rmsnorm statistic is the
//   8-warp order (STAT_NT = 256 here too: MV_STAT8 with 16 warps).
// Here: the integer dots are exact in any order, so mma.sync m16n8k16 (k32 for Q4_K) forms them:
// A = 16 weight rows x one chunk (or half), B = 8 columns n = 2 i + p: token 4 j + i, level p (j:
// the n-tile, MQ_NT = ceil(MV_M / 4) of them), so lane (g, t) receives D of rows g and g + 8, token
// 4 j + t, both levels (d0, d1 = row g's h, l; d2, d3 = row g + 8's): the chains of those rows and
// that token live in that lane, and every step above is the same instruction on the same values
// (Q8_0's float(D) as small_int_float's 0x4B400000 trick, the bias as the MMA's C; NVFP4 / Q4_K by
// __int2float_rn; any exact conversion gives the same float).  The K split: warp (st, kw) of a
// pass takes its 16-row sub-tile st and the chains L = 2 kw + c + 2 MQ_KW i (c = 0, 1; i <
// MQ_NP = 16 / MQ_KW), i.e. the chunk pairs (2 kw + 2 MQ_KW i, +1) of every 32-chunk k-tile, in
// k-tile order: each chain's chunks in increasing order.  At the pass's end the warp folds its
// own tree levels (16 .. 2 MQ_KW: chains i, i + MQ_NP / 2, ...), leaving residue r = 2 kw + c
// (the subtree of L = r mod 2 MQ_KW), and the block finishes the tree over the residues in
// shared memory (o = MQ_KW .. 1: v[r] += v[r + o]).  The same pairs are added, so the same bits.
// K ranges (cuda_linear.mma_plan: where the m tokens' codes of the whole row do not fit beside
// the ring; prologues none and qx, whose staging is per 32-input block): the row's k-tiles run as R
// contiguous ranges [kt0, kt1), one launch each over the same rows, in k order; a launch stages x
// for its range alone (a block's codes and record do not depend on the other blocks).  A launch
// with kt0 > 0 starts each chain at the value the launch before left in part (a global f32
// scratch, [global pass][value][thread]: by pass row0 / MQ_RB, not by block, so the grids need
// not agree) instead of +0; one that ends before the row's last k-tile stores its chains there as
// they are instead of folding them; only the last folds, finishes the tree, applies gs and the
// epilogue (and qx_out).  A chain's f32 is stored and loaded exactly, and its chunks still come in
// increasing order (launch r + 1 reads part after its pdl_wait, so after launch r completed), so
// every chain holds the one-launch value at every step and the tree adds the same values: the
// same bits as one launch, and as the SIMT kernel (kernel_refs.matvec_a8_mma_order's ranges).
// Only the launches over several ranges are built with the range code (MQ_SPLIT 1, mma_plan); a
// one-range build ignores kt0, kt1 and part (fewer registers: 110 against 117 at Q8_0 m = 2).
//
// Layout.  The weights stream through a ring of MQ_STAGES stages (cp.async, 16-byte pieces, no
// register cost for the bytes in flight): per stage one k-tile (32 chunks) of a pass's MQ_RB rows,
// the q plane at a row pitch of 528 bytes (ldmatrix rows in distinct banks) and the k-tile's
// scale bytes (n_in / 16 per row in every format here: 2 VPC bytes per k-tile, pitch + 16), read
// from the planes as they are (cuda_weights.repack_host: no second copy).  A fragments come from
// ldmatrix (rows g / g + 8, chunks c0 / c0 + 1 of the pair: the word t of each row's chunk is its
// k-slot t), B fragments from ldmatrix on x's staged code planes (plane 2m + p at a stride of
// n_in + 16 bytes: 8 planes in distinct banks), x's scales as float2 per (block, token).  The
// items (pass, k-tile) of a block run in sequence through the ring, one barrier each; a pass's
// partial sums are combined (tree, gs, epilogue) by all threads at the next item, through a
// buffer per pass parity; with qx_out (64-row tiles) warp 0 quantizes a tile one item after its
// last pass is combined (matvec_a8.cuh qx_write_tile), through a buffer per tile parity.
//
// Napkin math (Qwen3-8B, H100 SXM: ~3 TB/s, 132 SMs at ~1.75 GHz: ~13 bytes per cycle per SM; an
// SM issues 4 warp instructions per cycle).  A k-tile stage of a 16-row pass is 8.5 KB of q +
// 0.5 (Q8_0) / 1 KB (NVFP4, Q4_K) of scales: ~700-750 SM cycles of bandwidth.  SASS per warp and
// chunk pair (sm_90a): Q8_0 ~40 at m <= 4 (one n-tile: 2 ldmatrix, 2 MMAs, per MMA value 1 FADD
// + 1 FFMA, per block and value 1 FMUL), ~70 at m <= 8; NVFP4 ~115 / ~155 (the E2M1 decoding,
// ~11 per 8 codes as in the SIMT kernel, and the scale conversions are m-independent); Q4_K ~90
// (the scale bits, shared by the row group's lanes); plus ~35 per item and warp (copies, barrier,
// loop).  So per stage: Q8_0 ~900 (m <= 4, 8 warps x 2 pairs) / ~2700 per 32-row stage (m <= 8,
// 16 warps) -> ~1.3 / ~2.0 of the 4 instructions a cycle: the weight stream bounds it; NVFP4
// ~2100 / ~5600 -> ~2.8 / ~3.7 a cycle: near the issue bound (at m <= 8 at it), Q4_K ~1750 / m <=
// 4.  At m = 9..16 (three or four n-tiles; 8 warps, one 16-row sub-tile per pass: MV_NW 16 would
// need 128 registers and NVFP4 spills there) each n-tile adds ~30 (Q8_0) / ~40 (NVFP4) per pair:
// Q8_0 ~2400 per 16-row stage at m = 16 -> ~3.4 a cycle, NVFP4 ~3800 -> past the issue bound by
// ~1.3x; either way one launch for 16 tokens against two of 8, each streaming the weights.
// (The SIMT kernel issues ~9 dp4a / FMA / LDS instructions per row, chunk and token: Q8_0 ~350
// per 16-row stage at m = 1, ~4x that at m = 4; its m-row steps are bound by registers and
// latency, docs/performance.md.)  The MMAs use a few % of the tensor cores.  The bytes in flight
// are the ring's (MQ_STAGES - 1 stages per block: 45-90 KB per SM), not registers.  The floor is
// the weight bytes over the bandwidth, as at m = 1: Q8_0 gate|up 24576 x 4096 = 107 MB -> 36 us.
// Costs that grow with m: the staged x (2.25 n_in bytes per token: a 4096-input matrix holds 16
// tokens in ~148 KB, a 12288-input down projection 6 in 227 KB with the ring) and its prologue
// (every block quantizes all of x, as the SIMT kernel).  Past that K ranges: they stage 2.25 (kt1 -
// kt0) 32 VPC bytes per token, and the chains cross each range boundary through part once, written
// and read: per pass MV_NT x MQ_NV floats (MQ_NV = MQ_NP * 2 * 2 * MQ_NT: the 32 chains of MQ_RB
// rows x 4 MQ_NT token columns).  Qwen3-8B down at m = 8 (16 warps, MQ_KW 8: 512 x 16 floats = 32
// KB per 32-row pass, 128 passes, R = 2): 4.2 MB written + 4.2 MB read against 53.5 MB of Q8_0
// weights (16 %) or 28.3 MB of NVFP4 (30 %), much of it from L2 (written by one launch, read by the
// next); the groups of rows it replaces read all the weights once per group (+100 % at 6 + 2 rows).
// At m = 16 (8 warps, MQ_KW 8: 256 x 32 floats = 32 KB per 16-row pass, 256 passes, R = 3): 8.4 MB
// per boundary, 16.8 MB written + 16.8 MB read (63 % of Q8_0's bytes, 119 % of NVFP4's), against
// +200 % for groups of 6 + 6 + 4 rows.  The chain loads of a pass are issued at the end of the one
// before, their latency under the next item's barrier.
//
// Limits: n_in a multiple of 256 (every scale plane's row 16-byte aligned: the ring copies whole
// 16-byte pieces; a K range of whole k-tiles keeps it so), or for Q8_0 and NVFP4 of 64 with MQ_S4
// (rows of n_in / 16 scale bytes, 4-byte aligned, copied in 4-byte pieces: SmolLM2-135M's 576
// inputs, Qwen2.5-0.5B's 896; chunk pairs stay whole); the last k-tile may be partial (chunks and
// scale pieces past the row are not copied, their chains take no step); n_out any (rows past it
// clamped to the last and not stored).  Dynamic shared memory: cuda_linear.mma_smem (the ring, then the staged x
// of the widest range, the scales, the pass buffers).  part: cuda_linear.mma_part_floats.

#include "matvec_common.cuh"
#ifndef MV_MINB  // blocks per SM the register budget must allow (cuda_linear.mma_plan)
#define MV_MINB 1
#endif
#include "matvec_a8.cuh"

#if !(FMT == F_Q8_0 || FMT == F_NVFP4 || FMT == F_Q4_K)
#error "matvec_mma: Q8_0, NVFP4 or Q4_K weights"
#endif
#ifndef MQ_KW  // warps per 16-row sub-tile (the K split): 4 or 8
#define MQ_KW 8
#endif
#ifndef MQ_STAGES  // weight k-tiles in the ring
#define MQ_STAGES 4
#endif
#ifndef MQ_SPLIT  // 1: a launch over one of several K ranges (kt0, kt1, part); 0: the whole row, the range code compiled out
#define MQ_SPLIT 0
#endif
#if MQ_KW != 4 && MQ_KW != 8
#error "MQ_KW: 4 or 8 warps per sub-tile"
#endif
#define MQ_ST (MV_NW / MQ_KW)       // 16-row sub-tiles per pass
#define MQ_RB (16 * MQ_ST)          // rows per pass
#define MQ_NP (16 / MQ_KW)          // chunk pairs per warp and k-tile
#define MQ_NT ((MV_M + 3) / 4)      // n-tiles of 4 tokens x 2 levels
#define MQ_KT 32                    // chunks per k-tile: one step of every chain
#define MQ_NV (MQ_NP * 2 * 2 * MQ_NT)  // chains per thread (acc)
#define MQ_QP (MQ_KT * 16 + 16)     // q tile row pitch (bytes)
#define MQ_SB (2 * VPC)             // scale bytes per row and k-tile (n_in / 16 per row)
#define MQ_SP (MQ_SB + 16)          // scale tile row pitch
#ifndef MQ_S4  // 1: scale rows not 16-byte aligned (Q8_0 / NVFP4 rows of 64k, not 256k, inputs): 4-byte pieces
#define MQ_S4 0
#endif
#define MQ_SPB (MQ_S4 ? 4 : 16)     // bytes per scale piece
#define MQ_STAGE (MQ_RB * (MQ_QP + MQ_SP))
#define MQ_QX_ROWS 64               // a qx_out tile: 32 outputs = one 32-input block of the next x

BW24_DEVICE void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
BW24_DEVICE void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
// D = A . B + C, s8 x s8 -> s32, 16 x 8 x 16 (a: rows g, g + 8 at k-slots 4t..4t+3; b: column g)
BW24_DEVICE void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b, int c) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a0), "r"(a1), "r"(b), "r"(c));
}
// 16 x 8 x 32 (a2, a3 / b1: k-slots 16 + 4t..)
BW24_DEVICE void mma_k32(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// x's scales per 32-input block and token, as the chain steps take them (the values a8_records
// stages for the SIMT kernel): Q8_0 (2^e, 2^(e-8)); NVFP4 (2^(e-1), -); Q4_K (2^(e-8), the block's
// exact x sum 2^(e-8) (256 sum h + sum l))
BW24_DEVICE float2 mq_record(int e, int sh0, int sh1, int sl0, int sl1) {
#if FMT == F_Q8_0
    (void)sh0; (void)sh1; (void)sl0; (void)sl1;
    return make_float2(pow2f(e), pow2f(e - 8));
#elif FMT == F_NVFP4
    (void)sh0; (void)sh1; (void)sl0; (void)sl1;
    return make_float2(pow2f(e - 1), 0.0f);
#else
    return make_float2(pow2f(e - 8), __fmul_rn((float)(256 * (sh0 + sh1) + sl0 + sl1), pow2f(e - 8)));
#endif
}

// The staging sink (dot_a8.cuh: A8Planes' interface, written by matvec_a8.cuh's stage_a8 / stage_qx):
// token m's level h codes at xw + 2m*xps words, level l at +xps (xps = n_in/4 + 4: plane starts 16
// bytes apart mod 128, so an ldmatrix's 8 planes hit distinct banks); block b's scales at
// sc[b * MV_M + m]
struct MmaPlanes {
    uint32_t* xw;
    float2* sc;
    int xps;
    int lstride;  // = xps
    BW24_DEVICE uint32_t* codes(int m) const { return xw + 2 * m * xps; }
    BW24_DEVICE float2* recs(int m) const { return sc + m; }
    BW24_DEVICE void record(float2* r, int b, int e, int sh0, int sh1, int sl0, int sl1) const {
        r[b * MV_M] = mq_record(e, sh0, sh1, sl0, sl1);
    }
};

// Q8_0's small_int_float of an MMA result seeded with 0x4B400000 (|D| < 2^22)
BW24_DEVICE float biased_float(int d) { return __fsub_rn(__int_as_float(d), 12582912.0f); }

// One chunk pair (k-tile-local chunks c0, c0 + 1, global kc0, kc0 + 1) of this warp's sub-tile:
// the MMAs and the chain steps acc[c][rr][j] (chunk c0 + c, row g + 8 rr, token 4 j + t).  qaddr:
// this lane's ldmatrix row of the stage's q tile (row lane & 15 of the sub-tile, chunk c0 + lane /
// 16); srow0 / srow1: the stage's scale rows g, g + 8; xaddr[j]: this lane's ldmatrix row of x
// (plane (lane & 7) + 8 j).
BW24_DEVICE void mq_pair(float (&acc)[2][2][MQ_NT], uint32_t qaddr, const unsigned char* srow0, const unsigned char* srow1,
                         const uint32_t (&xaddr)[MQ_NT], int c0, int kc0, int nck, const float2* sc, uint32_t nv_t0) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    (void)nck; (void)nv_t0; (void)c0;
    // A: words t of rows g, g + 8 for chunks c0, c0 + 1 (matrices 0-3 from lanes 0-7, 8-15, 16-23, 24-31)
    uint32_t w[4];
    ldsm_x4(w, qaddr);
    // this lane's tokens 4 j + t (a clamped token's columns are computed and never stored)
    int tok[MQ_NT];
#pragma unroll
    for (int j = 0; j < MQ_NT; ++j) tok[j] = min(4 * j + t, MV_M - 1);
#if FMT == F_Q8_0
    // B: chunk c's 16 code bytes of the 8 planes of n-tile j (x4: (j, c) = (0,0), (0,1), (1,0), (1,1))
    uint32_t b[MQ_NT][2];
    // (n-tiles j, j + 1 per x4; an odd last one by x2, lanes 0-15's rows)
#pragma unroll
    for (int j = 0; j + 1 < MQ_NT; j += 2) {
        uint32_t r4[4];
        ldsm_x4(r4, ((lane >> 4) ? xaddr[j + 1] : xaddr[j]) + 16 * (kc0 + ((lane >> 3) & 1)));
        b[j][0] = r4[0]; b[j][1] = r4[1]; b[j + 1][0] = r4[2]; b[j + 1][1] = r4[3];
    }
#if MQ_NT % 2
    {
        uint32_t r2[2];
        ldsm_x2(r2, xaddr[MQ_NT - 1] + 16 * (kc0 + ((lane >> 3) & 1)));
        b[MQ_NT - 1][0] = r2[0];
        b[MQ_NT - 1][1] = r2[1];
    }
#endif
    int d[2][MQ_NT][4];
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int j = 0; j < MQ_NT; ++j) mma_k16(d[c][j], w[2 * c], w[2 * c + 1], b[j][c], 0x4B400000);
    // the pair's block: d of rows g, g + 8 (f16), x's (2^e, 2^(e-8)) of this lane's tokens
    const int blk = kc0 >> 1;
    const float a0[2] = {__half2float(*reinterpret_cast<const __half*>(srow0 + c0)),
                         __half2float(*reinterpret_cast<const __half*>(srow1 + c0))};
    float ph[2][MQ_NT], pl[2][MQ_NT];
#pragma unroll
    for (int j = 0; j < MQ_NT; ++j) {
        const float2 dx = sc[blk * MV_M + tok[j]];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            ph[rr][j] = __fmul_rn(a0[rr], dx.x);
            pl[rr][j] = __fmul_rn(a0[rr], dx.y);
        }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int j = 0; j < MQ_NT; ++j) {
                float v = __fmaf_rn(biased_float(d[c][j][2 * rr]), ph[rr][j], acc[c][rr][j]);
                acc[c][rr][j] = __fmaf_rn(biased_float(d[c][j][2 * rr + 1]), pl[rr][j], v);
            }
#else
    // B: per n-tile j, halves (c, h) of chunks c0, c0 + 1: inputs 0-15 of chunk kc at byte 16 kc,
    // 16-31 at 16 (nck + kc) (dot_a8.cuh a8_word); x4 matrices (c, h) = (0,0), (0,1), (1,0), (1,1)
    uint32_t b[MQ_NT][2][2];
#pragma unroll
    for (int j = 0; j < MQ_NT; ++j) {
        uint32_t r4[4];
        const int q = lane >> 3;
        ldsm_x4(r4, xaddr[j] + 16 * ((q & 1) * nck + kc0 + (q >> 1)));
        b[j][0][0] = r4[0]; b[j][0][1] = r4[1]; b[j][1][0] = r4[2]; b[j][1][1] = r4[3];
    }
    // A operands: the weight integers of values 4t..4t+3 (lo) and 16+4t.. (hi) of rows g, g + 8
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#if FMT == F_NVFP4  // doubled E2M1 values + 128 (nvfp4_weight_bytes), made signed
        nvfp4_weight_bytes(w[k], nv_t0, lo[k], hi[k]);
        lo[k] ^= 0x80808080u;
        hi[k] ^= 0x80808080u;
#else  // Q4_K: the nibble chunk's low / high nibbles (formats.cuh qwords)
        lo[k] = w[k] & 0x0F0F0F0Fu;
        hi[k] = (w[k] >> 4) & 0x0F0F0F0Fu;
#endif
    }
#if FMT == F_NVFP4
    int d[2][2][MQ_NT][4];  // [chunk][half][n-tile]
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int j = 0; j < MQ_NT; ++j) {
            mma_k16(d[c][0][j], lo[2 * c], lo[2 * c + 1], b[j][c][0], 0);
            mma_k16(d[c][1][j], hi[2 * c], hi[2 * c + 1], b[j][c][1], 0);
        }
    // the pair's scale word (bytes 2c, 2c + 1: chunk c's halves) of rows g, g + 8
    const uint32_t sw[2] = {*reinterpret_cast<const uint32_t*>(srow0 + 2 * c0), *reinterpret_cast<const uint32_t*>(srow1 + 2 * c0)};
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        float s[2][2];  // [row][half]
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) nvfp4_scales_f16(sw[rr], c, s[rr][0], s[rr][1]);
#pragma unroll
        for (int j = 0; j < MQ_NT; ++j) {
            const float dx = sc[(kc0 + c) * MV_M + tok[j]].x;
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    acc[c][rr][j] = __fmaf_rn(__int2float_rn(d[c][h][j][2 * rr] * 256 + d[c][h][j][2 * rr + 1]),
                                              __fmul_rn(s[rr][h], dx), acc[c][rr][j]);
        }
    }
#else  // Q4_K: one k32 MMA per chunk; its superblock record (chunks c0, c0 + 1 share it)
    int d[2][MQ_NT][4];
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int j = 0; j < MQ_NT; ++j) mma_k32(d[c][j], lo[2 * c], lo[2 * c + 1], hi[2 * c], hi[2 * c + 1], b[j][c][0], b[j][c][1]);
    // chunk_scales of (row g + 8 rr, chunk c0 + c): lane t of the row group decodes rr = t / 2, c =
    // t % 2 once (its sub-block's 6-bit scale and min: the bit work is most of a Q4_K pair), and
    // the group's four lanes exchange them (chunks c0, c0 + 1 lie in one half of the superblock:
    // chunk_scales' branch is warp-uniform)
    float a_own, b_own;
    {
        Raw r;
        r.s = *reinterpret_cast<const uint4*>(((t >> 1) ? srow1 : srow0) + 16 * (c0 >> 3));
        float a1;
        chunk_scales(r, kc0 + (t & 1), a_own, a1, b_own);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        float a[2], bm[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            a[rr] = __shfl_sync(0xffffffffu, a_own, (lane & ~3) | (rr << 1) | c);
            bm[rr] = __shfl_sync(0xffffffffu, b_own, (lane & ~3) | (rr << 1) | c);
        }
#pragma unroll
        for (int j = 0; j < MQ_NT; ++j) {
            const float2 dx = sc[(kc0 + c) * MV_M + tok[j]];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const float v = __fmaf_rn(__int2float_rn(d[c][j][2 * rr] * 256 + d[c][j][2 * rr + 1]), __fmul_rn(a[rr], dx.x),
                                          acc[c][rr][j]);
                acc[c][rr][j] = __fmaf_rn(bm[rr], dx.y, v);
            }
        }
    }
#endif
#endif
}

// The last steps of pass outputs (o, m): partial sums red[r][local row][m] of the residues r <
// 2 MQ_KW (the tree's levels o = MQ_KW .. 1), then gs
BW24_DEVICE float mq_tree(const float* red, int rl, int m, int o, int n_out, const float* __restrict__ gscale) {
    float v[2 * MQ_KW];
#pragma unroll
    for (int r = 0; r < 2 * MQ_KW; ++r) v[r] = red[(r * MQ_RB + rl) * MV_M + m];
#pragma unroll
    for (int s = MQ_KW; s >= 1; s >>= 1)  // (the bounds constant per step: fully unrolled, in registers)
#pragma unroll
        for (int r = 0; r < MQ_KW; ++r)
            if (r < s) v[r] = __fadd_rn(v[r], v[r + s]);
    return gscale && o < n_out ? __fmul_rn(v[0], gscale[o]) : v[0];
}

// Where an item (a pass's k-tile) of this block lies: k-tile kt of pass pip (of ph) of the block's
// tile tord (0, 1, ...: tile blockIdx.x + gridDim.x tord), whose first row is row0.  Advanced in
// item order (no division per item).
struct MqCursor {
    int kt, pip, tord, row0;
    BW24_DEVICE void next(int nkt, int ph, int tile_rows) {
        if (++kt < nkt) return;
        kt = 0;
        row0 += MQ_RB;
        if (++pip < ph) return;
        pip = 0;
        ++tord;
        row0 = ((int)blockIdx.x + (int)gridDim.x * tord) * tile_rows;
    }
};

extern "C" __global__ void __launch_bounds__(MV_NT, MV_MINB)
matvec_mma(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
           const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
           float* __restrict__ out, const float* __restrict__ normw, int n_out, int n_in, int ldx,
           int pro, int epi, float eps, const uint32_t* __restrict__ qx_in, uint32_t* __restrict__ qx_out,
           float* __restrict__ part, int kt0, int kt1) {
    (void)wh; (void)wd;
    extern __shared__ float4 smem4[];
    unsigned char* ring = reinterpret_cast<unsigned char*>(smem4);          // [MQ_STAGES][MQ_STAGE]
    // this launch's K range: k-tiles [kt0, kt1) of the row's nkt_all, chunks [kb, kb + nck_r),
    // staged as x of n_r inputs (the ring's k-tiles, x's planes and records are the range's)
    const int nck = n_in / VPC, nkt_all = (nck + MQ_KT - 1) / MQ_KT;
#if !MQ_SPLIT
    (void)part;
    kt0 = 0;
    kt1 = nkt_all;
#endif
    const bool from_part = MQ_SPLIT && kt0 > 0, to_part = MQ_SPLIT && kt1 < nkt_all;
    const int kb = kt0 * MQ_KT, nck_r = min(kt1 * MQ_KT, nck) - kb, n_r = nck_r * VPC;
    const int xps = n_r / 4 + 4, nb = n_r / 32;
    uint32_t* xw = reinterpret_cast<uint32_t*>(ring + MQ_STAGES * MQ_STAGE);  // [MV_M][2][xps] code words
    float2* sc = reinterpret_cast<float2*>(xw + 2 * MV_M * xps);              // [nb][MV_M] x scales
    float* red = reinterpret_cast<float*>(sc + nb * MV_M);                    // [2][2 MQ_KW][MQ_RB][MV_M] pass partials
    float* stat = red + 2 * 2 * MQ_KW * MQ_RB * MV_M;                         // [MV_NW] the rmsnorm statistic
    float* qxs = stat + MV_NW;                                                // [2][MV_M][32] qx_out's tile outputs
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int st = warp / MQ_KW, kw = warp % MQ_KW, g = lane >> 2, t = lane & 3;
    const bool xb16 = (pro & PRO_BF16) != 0;
    pro &= ~PRO_BF16;
    const bool qx = qx_out != nullptr && epi == EPI_SWIGLU && !to_part;
    const int tile_rows = qx ? MQ_QX_ROWS : MQ_RB, ph = tile_rows / MQ_RB;  // passes per tile
    const int ntiles = (n_out + tile_rows - 1) / tile_rows;
    if ((int)blockIdx.x >= ntiles) return;
    const int my_tiles = (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
    const int nkt = kt1 - kt0;
    const int n_items = my_tiles * ph * nkt;
    const int srow_bytes = n_in / 16, srow_r = n_r / 16;  // a row of the scale plane; the range's part of it
    const MqCursor first{0, 0, 0, (int)blockIdx.x * tile_rows};

    // The copies of one item into its stage: lane L copies chunk L of the k-tile of rows warp +
    // MV_NW u (u < MQ_NP: MQ_RB * 32 pieces), and the MQ_RB * SPR scale pieces of MQ_SPB bytes go
    // to threads tid + MV_NT h (h < SPT); rows past n_out read the last row, chunks past the range's
    // nothing.  One commit group per item (an empty one past the block's last item).  The sources
    // of a pass's rows are set when its first k-tile is issued (rebase: 32-bit offsets, the planes
    // having fewer than 2^32 pieces: registers); a k-tile adds its offset.
    constexpr int SPR = MQ_SB / MQ_SPB;                   // scale pieces per row
    constexpr int SPT = (MQ_RB * SPR + MV_NT - 1) / MV_NT;  // scale pieces per thread
    unsigned qsrc[MQ_NP], ssrc[SPT];  // uint4s from wq, bytes from ws
    MqCursor iss = first;
    int issued = 0;
    auto rebase = [&]() {
#pragma unroll
        for (int u = 0; u < MQ_NP; ++u) qsrc[u] = (unsigned)min(iss.row0 + warp + MV_NW * u, n_out - 1) * nck + kb + lane;
#pragma unroll
        for (int h = 0; h < SPT; ++h) {
            const int pc = tid + MV_NT * h;
            ssrc[h] = (unsigned)min(iss.row0 + pc / SPR, n_out - 1) * srow_bytes + kt0 * MQ_SB + MQ_SPB * (pc % SPR);
        }
    };
    auto issue = [&]() {
        if (issued < n_items) {
            unsigned char* stg = ring + (issued % MQ_STAGES) * MQ_STAGE;
            if (iss.kt == 0) rebase();
            if (iss.kt * MQ_KT + lane < nck_r)
#pragma unroll
                for (int u = 0; u < MQ_NP; ++u)
                    cp_async16(stg + (warp + MV_NW * u) * MQ_QP + lane * 16, wq + (qsrc[u] + iss.kt * MQ_KT), 16);
#pragma unroll
            for (int h = 0; h < SPT; ++h) {
                const int pc = tid + MV_NT * h;
                if ((MQ_RB * SPR) % MV_NT == 0 || pc < MQ_RB * SPR) {
                    unsigned char* dst = stg + MQ_RB * MQ_QP + (pc / SPR) * MQ_SP + MQ_SPB * (pc % SPR);
                    const unsigned char* src = reinterpret_cast<const unsigned char*>(ws) + (ssrc[h] + iss.kt * MQ_SB);
                    if (iss.kt * MQ_SB + MQ_SPB * (pc % SPR) < srow_r) {
#if MQ_S4
                        cp_async4(dst, src, 4);
#else
                        cp_async16(dst, src, 16);
#endif
                    }
                }
            }
            iss.next(nkt, ph, tile_rows);
            if (++issued == n_items) pdl_trigger();  // the block's weight stream is issued
        }
        cp_async_commit();
    };
#pragma unroll 1
    for (int s = 0; s < MQ_STAGES - 1; ++s) issue();
    pdl_wait();  // x (and out, for the add epilogue) come from the previous kernel

    const MmaPlanes sink{xw, sc, xps, xps};  // the range's inputs (prologues none / qx: per 32-input block)
    if (pro == PRO_QX)
        stage_qx(qx_in, n_in, kb * VPC / 32, n_r, sink);
    else
        stage_a8(x + (long)kb * VPC, ldx, n_r, pro, eps, normw, xb16, sink, stat);
    const uint32_t nv_t0 = nv_table_word();  // NVFP4 (dot_a8.cuh)

    // the outputs of the pass at cursor c from its partial sums (red[par]): tree, gs, epilogue
    // (qx_out: into the tile buffer of its tile's parity)
    auto combine = [&](const MqCursor& c, int par) {
        const float* rb = red + par * 2 * MQ_KW * MQ_RB * MV_M;
        if (epi == EPI_SWIGLU) {  // rows (2i, 2i+1) = (gate_i, up_i) -> out[m, i], row stride n_out/2
            float* qxb = qxs + (c.tord & 1) * MV_M * 32;
            for (int it = tid; it < (MQ_RB / 2) * MV_M; it += MV_NT) {
                const int q = it / MV_M, m = it % MV_M;
                const int o = c.row0 + 2 * q;
                if (o + 1 >= n_out) continue;
                const float a = swiglu_act(mq_tree(rb, 2 * q, m, o, n_out, gscale), mq_tree(rb, 2 * q + 1, m, o + 1, n_out, gscale));
                out[(long)m * (n_out >> 1) + (o >> 1)] = a;
                if (qx) qxb[m * 32 + c.pip * (MQ_RB / 2) + q] = xb16 ? bf16_round(a) : a;
            }
        } else {
            for (int it = tid; it < MQ_RB * MV_M; it += MV_NT) {
                const int rl = it / MV_M, m = it % MV_M;
                const int o = c.row0 + rl;
                if (o >= n_out) continue;
                const float v = mq_tree(rb, rl, m, o, n_out, gscale);
                float* dst = out + (long)m * n_out + o;
                *dst = epi == EPI_ADD ? __fadd_rn(*dst, v) : v;
            }
        }
    };
    // tile tord's 32 outputs per token (qxs[tord & 1]) quantized into block (its tile index) of qx_out
    auto quantize = [&](int tord) {
        if (warp == 0) qx_write_tile(qx_out, n_out >> 1, (int)blockIdx.x + (int)gridDim.x * tord, qxs + (tord & 1) * MV_M * 32);
    };

    const uint32_t ring_s = smem_addr(ring), xw_s = smem_addr(xw);
    // this lane's ldmatrix rows: q row (lane & 15) of the sub-tile, chunk c0 + (lane >> 4); x plane
    // (lane & 7) + 8 j, clamped to the last (those columns are never stored)
    const uint32_t q_lane = (uint32_t)((st * 16 + (lane & 15)) * MQ_QP + (lane >> 4) * 16);
    uint32_t x_lane[MQ_NT];
#pragma unroll
    for (int j = 0; j < MQ_NT; ++j) x_lane[j] = xw_s + (uint32_t)(min(8 * j + (lane & 7), 2 * MV_M - 1) * 4 * xps);
    float acc[MQ_NP][2][2][MQ_NT];
    // The chains between the launches over K ranges: part[global pass][value][thread] (value v: acc's
    // own order, ((i * 2 + c) * 2 + rr) * MQ_NT + j; the global pass row0 / MQ_RB: any grid), each
    // f32 stored and loaded as it is
    float* const chains = &acc[0][0][0][0];
    auto part_at = [&](int row0) { return part + (long)(row0 / MQ_RB) * (MQ_NV * MV_NT) + tid; };
    auto begin_chains = [&](int row0) {  // a pass's chains at its range's first k-tile: +0 (the contract's acc), or
        const float* p = from_part ? part_at(row0) : nullptr;  // where the range before left them
#pragma unroll
        for (int v = 0; v < MQ_NV; ++v) chains[v] = p ? __ldcg(p + v * MV_NT) : 0.0f;
    };
    begin_chains(first.row0);
    MqCursor cur = first, done = first;  // the item computed; the pass whose partials await their combine
    int pass = 0;                        // cur's pass ordinal (the partial buffers' parity)
    bool pend_pass = false;
    int pend_tile = -1;                  // a tile to quantize at the next item
#pragma unroll 1
    for (int i = 0; i < n_items; ++i) {
        cp_async_wait<MQ_STAGES - 2>();  // this thread's pieces of item i landed
        __syncthreads();                 // everyone's; item i - 1's stage is consumed
        issue();
        if (pend_tile >= 0) quantize(pend_tile);
        pend_tile = -1;
        if (pend_pass) {
            combine(done, (pass - 1) & 1);
            if (qx && done.pip == ph - 1) pend_tile = done.tord;
            pend_pass = false;
        }
        const int stage = i % MQ_STAGES;
        const unsigned char* srow0 = ring + stage * MQ_STAGE + MQ_RB * MQ_QP + (st * 16 + g) * MQ_SP;
        const uint32_t qbase = ring_s + (uint32_t)(stage * MQ_STAGE) + q_lane;
#pragma unroll
        for (int ip = 0; ip < MQ_NP; ++ip) {
            const int c0 = 2 * kw + 2 * MQ_KW * ip, kc0 = cur.kt * MQ_KT + c0;
            if (kc0 < nck_r)  // warp-uniform; nck_r is even (n_in % 64 == 0); kc0: the chunk in the range (x's)
                mq_pair(acc[ip], qbase + c0 * 16, srow0, srow0 + 8 * MQ_SP, x_lane, c0, kc0, nck_r, sc, nv_t0);
        }
        const bool pass_end = cur.kt == nkt - 1;
        if (pass_end && to_part) {  // the range's last k-tile, not the row's: the chains out as they are
            float* p = part_at(cur.row0);
#pragma unroll
            for (int v = 0; v < MQ_NV; ++v) __stcg(p + v * MV_NT, chains[v]);
        } else if (pass_end) {  // the row's last k-tile: the warp's tree levels, its partials out
#pragma unroll
            for (int h = MQ_NP / 2; h >= 1; h >>= 1)
#pragma unroll
                for (int ip = 0; ip < MQ_NP / 2; ++ip)
                    if (ip < h)
#pragma unroll
                        for (int c = 0; c < 2; ++c)
#pragma unroll
                            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                                for (int j = 0; j < MQ_NT; ++j) acc[ip][c][rr][j] = __fadd_rn(acc[ip][c][rr][j], acc[ip + h][c][rr][j]);
            float* rb = red + (pass & 1) * 2 * MQ_KW * MQ_RB * MV_M;
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int rr = 0; rr < 2; ++rr)
#pragma unroll
                    for (int j = 0; j < MQ_NT; ++j)
                        if (4 * j + t < MV_M) rb[((2 * kw + c) * MQ_RB + st * 16 + g + 8 * rr) * MV_M + 4 * j + t] = acc[0][c][rr][j];
            done = cur;
            pend_pass = true;
            ++pass;
        }
        cur.next(nkt, ph, tile_rows);
        if (pass_end && i + 1 < n_items) begin_chains(cur.row0);  // the next pass's (loads in flight over the next barrier)
    }
    if (to_part) return;  // the next range's launch continues the chains
    __syncthreads();  // the last pass's partials (and the last combine's tile outputs) are in
    if (pend_tile >= 0) quantize(pend_tile);
    combine(done, (pass - 1) & 1);
    if (qx) {
        __syncthreads();
        quantize(done.tord);
    }
}
