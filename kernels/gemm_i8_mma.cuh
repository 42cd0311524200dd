// gemm_i8_mma.cuh — the block of gemm_i8.cu's contract on the portable integer MMA
// (mma.sync.m16n8k32 s8 x s8 -> s32, sm_80 and later), shared by gemm_i8.cu gemm_i8_mma (the
// dense Q8_0 prefill: 128 tokens x 64 rows) and moe_group.cu gemm_i8_grouped (the grouped expert
// GEMM: 64 x 128 or 128 x 64, rows gathered per expert).  Per output the same formula in the same
// order whatever the tile shape or the row's place in it:
//   y[t, o] = sum over 32-blocks b, in k order, of  float(256 H + L) * (d[o, b] * 2^(e[t, b] - 8)),
// with H, L exact int32 block dots (one m16n8k32 each: a Q8_0 block is one MMA's k), one I2F and
// one FMA per block — gemm_i8's fold, so the rows equal gemm_i8's bit for bit.
// Geometry: 256 threads = 8 warps as WM (tokens) x 8 / WM (rows), warp tile 32 x 32 = 2 x 4
// m16n8 tiles: block tile BM = 32 WM tokens x BN = 256 / WM rows x a k tile of IM_BK = 64 (two
// blocks); n_in a multiple of 64.  A stage: the x h and l code tiles (BM rows x 64 bytes) and the
// W code tile (BN x 64 bytes) at a row pitch of 80 bytes (the fragment loads, word 20 r + t of 8
// rows x 4 lanes, hit 32 distinct banks), the x records (BM tokens x 2 blocks x 16 B) and the W
// scales (BN rows x 2 f16); a cp.async ring of IM_STAGES stages (3: 90 KB at 128 x 64, 69 KB at
// 64 x 128, inside the 99 KB of the small-shared-memory GPUs).
// Fragments (PTX ISA, mma.m16n8k32 .s8): A a0 = (row g, k bytes 4t..4t+3), a1 = row g + 8,
// a2 / a3 the same at k + 16; B b0 = (k 4t..4t+3, col g), b1 at k + 16; D d0, d1 = (row g, cols
// 2t, 2t + 1), d2, d3 = row g + 8 (g = lane / 4, t = lane % 4).
#pragma once
#include "gemm_common.cuh"

#define IM_BK 64
#define IM_PITCH 80
#define IM_STAGES 3
// one ring stage of a bm x bn tile: x h and l codes, W codes, x records, W scales; rounded up to 1 KB
#define IM_STAGE_BYTES_FOR(bm, bn) ((2 * (bm) * IM_PITCH + (bn) * IM_PITCH + (bm) * 2 * 16 + (bn) * 4 + 1023) / 1024 * 1024)

BW24_DEVICE void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {  // D = A.B (C = 0)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// The tile shape of WM warps along the tokens and this thread's share of a stage's copies: XJ x
// code pieces (16 B of one level) per level, of tile row x_row(j); WJ W code pieces; RJ records
// (16 B: one token's block), of tile row rec_row(j) (pieces past BM * 2 are none).
template <int WM>
struct I8Tile {
    static constexpr int BM = 32 * WM, BN = 256 / WM, WN = 8 / WM;
    static constexpr int A_BYTES = BM * IM_PITCH, W_BYTES = BN * IM_PITCH, REC_BYTES = BM * 2 * 16;
    static constexpr int STAGE = IM_STAGE_BYTES_FOR(BM, BN);
    static constexpr int XJ = BM * 4 / GM_NT, WJ = BN * 4 / GM_NT, RJ = (BM * 2 + GM_NT - 1) / GM_NT;
    static_assert(WM == 2 || WM == 4, "64- or 128-token tiles");
    static_assert(BN <= GM_NT, "one thread per row's scales");
    static BW24_DEVICE int x_row(int j) { return (threadIdx.x + GM_NT * j) >> 2; }
    static BW24_DEVICE int rec_row(int j) { return (threadIdx.x + GM_NT * j) >> 1; }
};

// The k loop of one block: acc[mi][ni][h] = the warp's outputs (tile row wm * 32 + mi * 16 + g +
// 8 (h >> 1), out row n0 + wn * 32 + ni * 8 + 2 t + (h & 1); wm = warp / WN, wn = warp % WN) of
// the tile whose rows come from QX rows xrows.row(j, x_row(j)) (codes) and rrows.row(j,
// rec_row(j)) (records) — the same rows, in the two copy partitions — against W rows [n0, n0 +
// BN).  PARTIAL: tile rows from `live` on are absent, the MMAs and folds of 16-row slices at or
// past it are skipped (warp-uniform).  smem: IM_STAGES * STAGE bytes.
template <int WM, bool PARTIAL, class XRows, class RRows>
BW24_DEVICE void gemm_i8_mma_tile(float (&acc)[2][4][4], const uint8_t* __restrict__ wq, const uint16_t* __restrict__ wsc,
                                  const uint32_t* __restrict__ qx, const XRows& xrows, const RRows& rrows, int n_out, int n_in,
                                  int n0, float4* smem4, int live) {
    using G = I8Tile<WM>;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem4);
    const char* gbase = reinterpret_cast<const char*>(smem4);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / G::WN, wn = warp % G::WN;  // tokens [32 wm, +32), rows [32 wn, +32) of the block tile
    const int nkt = n_in / IM_BK, nb = n_in / 32;
    const long qx_row = qx_row_words(n_in);
    // tile kt -> stage s: x h codes at byte 0 of the QX row, l codes at byte n_in, records at word
    // n_in / 2 (common.cuh); W codes row-major [n_out][n_in] bytes, scales [n_out][nb] f16
    auto load = [&](int kt, int s) {
        const uint32_t st = sbase + s * G::STAGE;
#pragma unroll
        for (int j = 0; j < G::XJ; ++j) {
            const int i = tid + GM_NT * j, r = i >> 2, u = i & 3;
            const bool ok = xrows.ok(j, r);
            const char* p = reinterpret_cast<const char*>(qx + (ok ? xrows.row(j, r) * qx_row : 0)) + kt * IM_BK + u * 16;
            cp_async16(st + r * IM_PITCH + u * 16, p, ok);
            cp_async16(st + G::A_BYTES + r * IM_PITCH + u * 16, p + n_in, ok);
        }
#pragma unroll
        for (int j = 0; j < G::WJ; ++j) {
            const int i = tid + GM_NT * j, r = i >> 2, u = i & 3;
            const bool ok = n0 + r < n_out;
            cp_async16(st + 2 * G::A_BYTES + r * IM_PITCH + u * 16, wq + (ok ? (long)(n0 + r) * n_in : 0) + kt * IM_BK + u * 16, ok);
        }
#pragma unroll
        for (int j = 0; j < G::RJ; ++j) {
            const int i = tid + GM_NT * j;  // records: token r = i / 2, block kb = i % 2 at i * 16
            if (i < G::BM * 2) {
                const bool ok = rrows.ok(j, i >> 1);
                cp_async16(st + 2 * G::A_BYTES + G::W_BYTES + i * 16, qx + (ok ? rrows.row(j, i >> 1) * qx_row : 0) + n_in / 2 + 4 * (2 * kt + (i & 1)), ok);
            }
        }
        if (tid < G::BN) {  // row tid's two f16 scales of the k tile
            const bool ok = n0 + tid < n_out;
            cp_async4(st + 2 * G::A_BYTES + G::W_BYTES + G::REC_BYTES + tid * 4, wsc + (ok ? (long)(n0 + tid) * nb : 0) + 2 * kt, ok);
        }
    };

#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;
#pragma unroll
    for (int s = 0; s < IM_STAGES - 1; ++s) {
        if (s < nkt) load(s, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const int g = lane >> 2, t4 = lane & 3;
    for (int kt = 0; kt < nkt; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(IM_STAGES - 2) : "memory");  // tile kt landed (own copies)
        __syncthreads();  // everyone's copies landed; every read of the stage refilled below is done
        if (kt + IM_STAGES - 1 < nkt) load(kt + IM_STAGES - 1, (kt + IM_STAGES - 1) % IM_STAGES);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const char* st = gbase + (kt % IM_STAGES) * G::STAGE;
        const char* xh = st + (wm * 32) * IM_PITCH;
        const char* wt = st + 2 * G::A_BYTES + (wn * 32) * IM_PITCH;
        const int4* rec = reinterpret_cast<const int4*>(st + 2 * G::A_BYTES + G::W_BYTES);
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + 2 * G::A_BYTES + G::W_BYTES + G::REC_BYTES);
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            uint32_t b[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const char* p = wt + (ni * 8 + g) * IM_PITCH + kb * 32 + 4 * t4;
                b[ni][0] = *reinterpret_cast<const uint32_t*>(p);
                b[ni][1] = *reinterpret_cast<const uint32_t*>(p + 16);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                if (PARTIAL && wm * 32 + mi * 16 >= live) continue;
                int ih[4][4], il[4][4];
#pragma unroll
                for (int lv = 0; lv < 2; ++lv) {
                    const char* p = xh + lv * G::A_BYTES + (mi * 16 + g) * IM_PITCH + kb * 32 + 4 * t4;
                    const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(p), *reinterpret_cast<const uint32_t*>(p + 8 * IM_PITCH),
                                           *reinterpret_cast<const uint32_t*>(p + 16), *reinterpret_cast<const uint32_t*>(p + 8 * IM_PITCH + 16)};
#pragma unroll
                    for (int ni = 0; ni < 4; ++ni) mma_s8(lv ? il[ni] : ih[ni], a, b[ni][0], b[ni][1]);
                }
                // the fold, as gemm_i8: the token's 2^(e - 8), the row's f16 scale, one I2F and one FMA
                float p[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) p[h] = pow2f(rec[(wm * 32 + mi * 16 + g + 8 * h) * 2 + kb].x - 8);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float dw = f16_bits_to_f32(sc[(wn * 32 + ni * 8 + 2 * t4 + e) * 2 + kb]);
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int v = 256 * ih[ni][2 * h + e] + il[ni][2 * h + e];
                            acc[mi][ni][2 * h + e] = __fmaf_rn((float)v, __fmul_rn(dw, p[h]), acc[mi][ni][2 * h + e]);
                        }
                    }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}
