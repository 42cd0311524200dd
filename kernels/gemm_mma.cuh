// gemm_mma.cuh — the block of the portable tensor-core GEMM (mma.sync.m16n8k16 bf16 -> f32):
// the register-staged producer of x and weight tiles and the k loop, shared by gemm_mma.cu (the
// dense prefill GEMM, 128-token tiles) and moe_group.cu (the grouped expert GEMM, 64- or
// 128-token tiles of rows gathered per expert).  The tile's token count changes no output's
// arithmetic: every output is one accumulator fed the same MMAs in the same order (k16 steps in
// k order; per step x_hi.W, then x_lo.W, then x_hi.W_lo), whatever its row's place.
// Warp layout: 8 warps as 2 (tokens) x 4 (out rows); warp tile (16 MI) x 32 = MI x 4 mma tiles;
// block tile (32 MI) x 128.
#pragma once
#include "gemm_common.cuh"

BW24_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

BW24_DEVICE void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


// Tile offsets (bf16 elements) of value (row r, k) in a 64-wide k tile: padded rows (row stride
// 72: the 8 rows of an ldmatrix land in distinct banks).
struct PaddedTile { static BW24_DEVICE int off(int r, int k) { return r * GM_LD + k; } };


// The weight half of the register-staged producer below: rows [n0, n0 + BN) of k tile kt, WCH
// chunks per thread (load_w: global loads into registers; store_w: decoded to exact values ->
// bf16 W and, when W_SPLIT, W_lo = bf16(W - bf16(W)), in the layout L; out-of-range rows and k
// are zeros).
template <int BN>
struct WeightStager {
    static constexpr int WCH = BN * GM_CPR / GM_NT;  // weight chunks per thread per k tile
    Raw wreg[WCH];
    bool wok[WCH];

    BW24_DEVICE void load_w(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
                            const void* __restrict__ wd, int n_out, int n_in, int n0, int kt) {
        const int tid = threadIdx.x, k0 = kt * GM_BK, nck = n_in / VPC;
#pragma unroll
        for (int j = 0; j < WCH; ++j) {
            const int i = tid + GM_NT * j, r = i / GM_CPR, kc = k0 / VPC + i % GM_CPR;
            wok[j] = (n0 + r < n_out) && kc < nck;
            if (wok[j]) fetch_chunk(wreg[j], wq, wh, ws, wd, n0 + r, nck, kc);
        }
    }

    template <class L>
    BW24_DEVICE void store_w(__nv_bfloat16* W, __nv_bfloat16* Wl, int kt) const {
        const int tid = threadIdx.x;
        (void)Wl;
#pragma unroll
        for (int j = 0; j < WCH; ++j) {
            const int i = tid + GM_NT * j, r = i / GM_CPR, cl = i % GM_CPR;
            float v[VPC];
            if (wok[j]) {
                decode_exact(wreg[j], kt * GM_CPR + cl, v);
            } else {
#pragma unroll
                for (int e = 0; e < VPC; ++e) v[e] = 0.0f;
            }
#if W_SPLIT
            float vl[VPC];
#pragma unroll
            for (int e = 0; e < VPC; ++e) vl[e] = __fsub_rn(v[e], __bfloat162float(__float2bfloat16_rn(v[e])));
#endif
#if VPC == 4
            // F32 chunks hold 4 values: an 8-byte store (a 16-byte one would be misaligned)
            *reinterpret_cast<uint2*>(W + L::off(r, cl * VPC)) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
#if W_SPLIT
            *reinterpret_cast<uint2*>(Wl + L::off(r, cl * VPC)) = make_uint2(pack_bf16x2(vl[0], vl[1]), pack_bf16x2(vl[2], vl[3]));
#endif
#else
#pragma unroll
            for (int e = 0; e < VPC; e += 8) {
                *reinterpret_cast<uint4*>(W + L::off(r, cl * VPC + e)) =
                    make_uint4(pack_bf16x2(v[e], v[e + 1]), pack_bf16x2(v[e + 2], v[e + 3]),
                               pack_bf16x2(v[e + 4], v[e + 5]), pack_bf16x2(v[e + 6], v[e + 7]));
#if W_SPLIT
                *reinterpret_cast<uint4*>(Wl + L::off(r, cl * VPC + e)) =
                    make_uint4(pack_bf16x2(vl[e], vl[e + 1]), pack_bf16x2(vl[e + 2], vl[e + 3]),
                               pack_bf16x2(vl[e + 4], vl[e + 5]), pack_bf16x2(vl[e + 6], vl[e + 7]));
#endif
            }
#endif
        }
    }
};

// Register-staged producer of one k tile: x rows of the BM-row tile as f32 (-> bf16, and the
// bf16 residual x - bf16(x) when split) and weight rows [n0, n0 + BN) decoded to their exact
// values (-> bf16, and the residual when W_SPLIT).  load() issues the global loads into
// registers; store() converts and writes them to shared memory in the layout L.  Out-of-range
// rows and k are zeros.  Which x row a tile row is comes from `rows` (gemm_common.cuh DenseRows,
// or the grouped GEMM's gathered RowTable): piece j of this thread is tile row r = row_of(j).
// GEMM_XPLANES=1 (the integer-dot contract): x arrives as its two exact bf16 planes, the code
// levels 2^e h and 2^(e-8) l of gemm_act.cu act_quant (x: the hi plane, xl: the lo plane), staged
// as they are — the planes gemm_wgp reads, so both paths see the same x split (a bf16 hi / lo
// split of their f32 sum is exact too, but its f32 tensor-core sums round differently).
#ifndef GEMM_XPLANES
#define GEMM_XPLANES 0
#endif
static_assert(!GEMM_XPLANES || GEMM_SPLIT, "the integer-dot contract's x is both its planes");
template <int BM, int BN>
struct TileStager : WeightStager<BN> {
    static constexpr int ACH = BM * GM_BK / 4 / GM_NT;  // x float4 (or 4-value plane pieces) per thread per k tile
    static_assert(ACH >= 1 && BM * GM_BK == ACH * 4 * GM_NT, "whole x pieces per thread");
#if GEMM_XPLANES
    uint2 ahi[ACH], alo[ACH];
#else
    float4 areg[ACH];
#endif

    static BW24_DEVICE int row_of(int j) { return (threadIdx.x + GM_NT * j) >> 4; }

    template <class Rows>
    BW24_DEVICE void load(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
                          const void* __restrict__ wd, const float* __restrict__ x, const Rows& rows, int n_out, int n_in,
                          int n0, int kt, const __nv_bfloat16* __restrict__ xl) {
        const int tid = threadIdx.x, k0 = kt * GM_BK;
        (void)xl;
#pragma unroll
        for (int j = 0; j < ACH; ++j) {
            const int i = tid + GM_NT * j, r = i >> 4, c = (i & 15) * 4;
            const bool ok = rows.ok(j, r) && k0 + c < n_in;
            const long src = rows.row(j, r);
#if GEMM_XPLANES
            const long e = src * n_in + k0 + c;
            ahi[j] = ok ? *reinterpret_cast<const uint2*>(reinterpret_cast<const __nv_bfloat16*>(x) + e) : make_uint2(0u, 0u);
            alo[j] = ok ? *reinterpret_cast<const uint2*>(xl + e) : make_uint2(0u, 0u);
#else
            areg[j] = ok ? *reinterpret_cast<const float4*>(x + src * n_in + k0 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
        }
        this->load_w(wq, wh, ws, wd, n_out, n_in, n0, kt);
    }

    // A, Al: x hi / lo tiles [BM rows]; W, Wl: weight hi / lo tiles [BN rows] (Al, Wl unused
    // unless GEMM_SPLIT / W_SPLIT)
    template <class L>
    BW24_DEVICE void store(__nv_bfloat16* A, __nv_bfloat16* Al, __nv_bfloat16* W, __nv_bfloat16* Wl, int kt) const {
        const int tid = threadIdx.x;
        (void)Al;
#pragma unroll
        for (int j = 0; j < ACH; ++j) {
            const int i = tid + GM_NT * j, r = i >> 4, c = (i & 15) * 4;
            uint2 hi, lo;
#if GEMM_XPLANES
            hi = ahi[j];
            lo = alo[j];
#else
            split_bf16x4(areg[j], hi, lo);
#endif
            *reinterpret_cast<uint2*>(A + L::off(r, c)) = hi;
#if GEMM_SPLIT
            *reinterpret_cast<uint2*>(Al + L::off(r, c)) = lo;
#endif
        }
        this->template store_w<L>(W, Wl, kt);
    }
};

// The block's dynamic shared memory: GM_BUFS buffers of the x and W tiles, plus x_lo
// (GEMM_SPLIT) and W_lo (W_SPLIT), bf16 rows of GM_LD, for a tile of bm tokens
// (cuda_linear._gemm_smem computes the same; tests/test_smem_contract.py).  GM_BUFS = 2: k tile
// i+1 is stored into the other buffer while tile i is used; 1 (cuda_linear.gemm_bufs, where 2 do
// not fit: the split kernels take 108 / 144 KB with two at 128 tokens, the 99 KB GPUs sm_86 /
// sm_89 / sm_120 allow 99): the next tile waits in registers until every warp is done with the
// buffer (one more barrier per k tile).  The MMAs of each output run in the same order either
// way: the same bits.
#ifndef GM_BUFS
#define GM_BUFS 2
#endif
static_assert(GM_BUFS == 1 || GM_BUFS == 2, "GM_BUFS is 1 or 2");
#define GM_SMEM_BYTES_FOR(bm) (GM_BUFS * 2 * GM_LD * ((1 + GEMM_SPLIT) * (bm) + (1 + W_SPLIT) * GM_BN))

// The k loop of one block: acc[mi][ni][h] = the warp's outputs (tile row wm * 16 MI + mi * 16 +
// g + 8 (h >> 1), out row n0 + wn * 32 + ni * 8 + 2 t + (h & 1); g = lane / 4, t = lane % 4, wm
// = warp / 4, wn = warp % 4) of the tile of BM = 32 MI x rows `rows` against weight rows [n0,
// n0 + GM_BN), over all n_in inputs.  PARTIAL: tile rows from `live` on are absent, the MMAs of
// 16-row slices at or past it are skipped (warp-uniform; their accumulators stay 0, not stored).
// smem: GM_SMEM_BYTES_FOR(BM) bytes.
template <int MI, bool PARTIAL, class Rows>
BW24_DEVICE void gemm_mma_tile(float (&acc)[MI][4][4], const uint4* __restrict__ wq, const void* __restrict__ wh,
                               const void* __restrict__ ws, const void* __restrict__ wd, const float* __restrict__ x,
                               const __nv_bfloat16* __restrict__ xl, const Rows& rows, int n_out, int n_in, int n0,
                               float4* smem4, int live) {
    constexpr int BM = 32 * MI;
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem4);        // [GM_BUFS][BM][LD]
    __nv_bfloat16* Ws = As + GM_BUFS * BM * GM_LD;                       // [GM_BUFS][BN][LD]
    __nv_bfloat16* Al = Ws + GM_BUFS * GM_BN * GM_LD;                    // [GM_BUFS][BM][LD] x_lo (GEMM_SPLIT)
    __nv_bfloat16* Wl = Al + (GEMM_SPLIT ? GM_BUFS * BM * GM_LD : 0);    // [GM_BUFS][BN][LD] W_lo (W_SPLIT)
    (void)Wl;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int nkt = (n_in + GM_BK - 1) / GM_BK;
    TileStager<BM, GM_BN> st;
    auto store = [&](int kt, int buf) {
        st.template store<PaddedTile>(As + buf * BM * GM_LD, Al + buf * BM * GM_LD,
                                      Ws + buf * GM_BN * GM_LD, Wl + buf * GM_BN * GM_LD, kt);
    };

#pragma unroll
    for (int a = 0; a < MI; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

    st.load(wq, wh, ws, wd, x, rows, n_out, n_in, n0, 0, xl);
    store(0, 0);
    __syncthreads();
    for (int kt = 0; kt < nkt; ++kt) {
        const int buf = GM_BUFS == 2 ? (kt & 1) : 0;
        if (kt + 1 < nkt) st.load(wq, wh, ws, wd, x, rows, n_out, n_in, n0, kt + 1, xl);
        const __nv_bfloat16* A = As + buf * BM * GM_LD + (wm * 16 * MI) * GM_LD;
        const __nv_bfloat16* W = Ws + buf * GM_BN * GM_LD + (wn * 32) * GM_LD;
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; ++kk) {
            uint32_t af[4], bq[2][4];
#pragma unroll
            for (int nj = 0; nj < 2; ++nj)
                ldmatrix_x4(bq[nj], W + (nj * 16 + ((lane >> 4) << 3) + (lane & 7)) * GM_LD + kk * 16 + ((lane >> 3) & 1) * 8);
            // per accumulator, a fixed order: k16 step kk, then hi before lo
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                if (PARTIAL && wm * 16 * MI + mi * 16 >= live) continue;
                const int aoff = (mi * 16 + (lane & 15)) * GM_LD + kk * 16 + (lane >> 4) * 8;
                ldmatrix_x4(af, A + aoff);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af, bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
#if GEMM_SPLIT
                ldmatrix_x4(af, Al + buf * BM * GM_LD + (wm * 16 * MI) * GM_LD + aoff);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af, bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
#endif
            }
#if W_SPLIT
            // third term: x_hi . W_lo (same accumulators, after hi.hi and lo.hi of this k16 step)
            const __nv_bfloat16* WL = Wl + buf * GM_BN * GM_LD + (wn * 32) * GM_LD;
#pragma unroll
            for (int nj = 0; nj < 2; ++nj)
                ldmatrix_x4(bq[nj], WL + (nj * 16 + ((lane >> 4) << 3) + (lane & 7)) * GM_LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                if (PARTIAL && wm * 16 * MI + mi * 16 >= live) continue;
                ldmatrix_x4(af, A + (mi * 16 + (lane & 15)) * GM_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af, bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
            }
#endif
        }
#if GM_BUFS == 1
        __syncthreads();  // every warp is done with the one buffer before tile kt + 1 overwrites it
#endif
        if (kt + 1 < nkt) store(kt + 1, GM_BUFS == 2 ? buf ^ 1 : 0);
        __syncthreads();
    }
}
