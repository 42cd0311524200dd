// gemm.cu — prefill GEMM on tensor cores over the repacked quantized weights (portable path:
// mma.sync.m16n8k16 bf16 -> f32, sm_80 and later, so sm_90 and sm_120 alike).
//
// Contract
//   gemm(wq, wh, ws, wd, gscale, x, out, T, n_out, n_in, epi)
//     y[t, o] = gs[o] * sum_k bf16(W[o, k]) * bf16(x[t, k])    (f32 accumulation)
//     epi 0: out[t*n_out + o] = y;  epi 1: out[t*n_out + o] += y   (t < T, o < n_out)
//   W[o, k] = the exact f32 value of formats.cuh decode_exact (bit-equal to quants.dequantize),
//   rounded to bf16 (exact for BF16 weights); x is f32 [T, n_in], rounded to bf16 in the A-tile
//   load; gs = gscale[o] (NVFP4 global scale) or 1.
//   NumPy reference: bf16(x) @ bf16(W).T in float64 (tests/gpu/test_gemm.py).
// Precision (GEMM_SPLIT, default 1): x is split into bf16 hi + lo parts, x_hi = bf16(x),
//   x_lo = bf16(x - x_hi), and each k16 step issues mma(W, x_hi) then mma(W, x_lo) into the
//   same f32 accumulator ("bf16x2" error compensation, Markidis et al. 2018): the activation
//   rounding error drops from ~2^-9 to ~2^-17, so the prefill logits follow the f32 decode path
//   (bw24chat check: prefill argmax = decode argmax).  The weights are exactly bf16 (BF16) or
//   rounded once (quantized formats).  GEMM_SPLIT=0 is the fast plain-bf16 variant.
// T-independence: no split-K; every output's k order is the fixed sequence of 64-wide k tiles,
// each 4 mma k16 steps in order, so a row's values do not depend on T or on the row's place in
// its tile (prefill of 256 vs 512 tokens gives identical rows).
// Geometry: block tile 128 (tokens) x 128 (out rows) x 64 (k), 256 threads = 8 warps as 2 (t)
// x 4 (o), warp tile 64 x 32 = 4 x 4 mma tiles; grid (ceil(n_out/128), ceil(T/128)).
// Pipeline: register-staged double buffer (the weights need decoding in registers anyway):
// global loads of k tile i+1 are issued before the mma work on tile i, then decoded/converted
// and stored to the other shared buffer; one barrier per k tile.  Shared: 2 x (128 + 128) rows
// x 72 bf16 (64 + 8 padding: ldmatrix rows land in distinct banks) = 73,728 bytes (> 48 KB:
// the wrapper raises the kernel's dynamic shared limit).
#include "common.cuh"
#include "formats.cuh"

#ifndef GEMM_SPLIT
#define GEMM_SPLIT 1
#endif
// Weights whose exact f32 values are not bf16 numbers (F32, F16 and the integer-scaled formats;
// not BF16, nor NVFP4 whose E2M1 x E4M3 products have <= 6 significant bits) are split too in
// the precise variant: W = W_hi + W_lo, and each k16 step adds x_hi.W_hi, x_lo.W_hi, x_hi.W_lo
// (x_lo.W_lo, ~2^-18 relative, is dropped) -- so prefill matches the exact-weight decode path.
#define W_SPLIT (GEMM_SPLIT && FMT != F_BF16 && FMT != F_NVFP4)
#define GM_BM 128
#define GM_BN 128
#define GM_BK 64
#define GM_LD (GM_BK + 8)
#define GM_NT 256
#define GM_CPR (GM_BK / VPC)                  // weight chunks per row per k tile
#define GM_WCH (GM_BN * GM_CPR / GM_NT)       // weight chunks per thread per k tile
#define GM_ACH (GM_BM * GM_BK / 4 / GM_NT)    // x float4 per thread per k tile (8)

BW24_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

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

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
     const void* __restrict__ wd, const float* __restrict__ gscale, const float* __restrict__ x,
     float* __restrict__ out, int T, int n_out, int n_in, int epi) {
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem4);  // [2][BM][LD]
    __nv_bfloat16* Ws = As + 2 * GM_BM * GM_LD;                    // [2][BN][LD]
#if GEMM_SPLIT
    __nv_bfloat16* Al = Ws + 2 * GM_BN * GM_LD;                    // [2][BM][LD] x_lo
#endif
#if W_SPLIT
    __nv_bfloat16* Wl = Al + 2 * GM_BM * GM_LD;                    // [2][BN][LD] W_lo
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int n0 = blockIdx.x * GM_BN;
    const long m0 = (long)blockIdx.y * GM_BM;
    const int nck = n_in / VPC;
    const int nkt = (n_in + GM_BK - 1) / GM_BK;

    float4 areg[GM_ACH];
    Raw wreg[GM_WCH];
    bool wok[GM_WCH];

    auto load_tile = [&](int kt) {
        const int k0 = kt * GM_BK;
#pragma unroll
        for (int j = 0; j < GM_ACH; ++j) {
            const int i = tid + GM_NT * j, r = i >> 4, c = (i & 15) * 4;
            areg[j] = (m0 + r < T && k0 + c < n_in) ? *reinterpret_cast<const float4*>(x + (m0 + r) * n_in + k0 + c)
                                                     : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < GM_WCH; ++j) {
            const int i = tid + GM_NT * j, r = i / GM_CPR, kc = k0 / VPC + i % GM_CPR;
            wok[j] = (n0 + r < n_out) && kc < nck;
            if (wok[j]) fetch_chunk(wreg[j], wq, wh, ws, wd, n0 + r, nck, kc);
        }
    };
    auto store_tile = [&](int kt, int buf) {
        __nv_bfloat16* A = As + buf * GM_BM * GM_LD;
        __nv_bfloat16* W = Ws + buf * GM_BN * GM_LD;
#pragma unroll
        for (int j = 0; j < GM_ACH; ++j) {
            const int i = tid + GM_NT * j, r = i >> 4, c = (i & 15) * 4;
            const uint32_t h01 = pack_bf16x2(areg[j].x, areg[j].y), h23 = pack_bf16x2(areg[j].z, areg[j].w);
            *reinterpret_cast<uint2*>(A + r * GM_LD + c) = make_uint2(h01, h23);
#if GEMM_SPLIT
            // x - bf16(x) is exact in f32; its own bf16 rounding is the residual error
            const float x0 = __fsub_rn(areg[j].x, __uint_as_float(h01 << 16)), x1 = __fsub_rn(areg[j].y, __uint_as_float(h01 & 0xFFFF0000u));
            const float x2 = __fsub_rn(areg[j].z, __uint_as_float(h23 << 16)), x3 = __fsub_rn(areg[j].w, __uint_as_float(h23 & 0xFFFF0000u));
            *reinterpret_cast<uint2*>(Al + buf * GM_BM * GM_LD + r * GM_LD + c) = make_uint2(pack_bf16x2(x0, x1), pack_bf16x2(x2, x3));
#endif
        }
#pragma unroll
        for (int j = 0; j < GM_WCH; ++j) {
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
            *reinterpret_cast<uint2*>(W + r * GM_LD + cl * VPC) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
#if W_SPLIT
            *reinterpret_cast<uint2*>(Wl + buf * GM_BN * GM_LD + r * GM_LD + cl * VPC) = make_uint2(pack_bf16x2(vl[0], vl[1]), pack_bf16x2(vl[2], vl[3]));
#endif
#else
#pragma unroll
            for (int e = 0; e < VPC; e += 8) {
                *reinterpret_cast<uint4*>(W + r * GM_LD + cl * VPC + e) =
                    make_uint4(pack_bf16x2(v[e], v[e + 1]), pack_bf16x2(v[e + 2], v[e + 3]),
                               pack_bf16x2(v[e + 4], v[e + 5]), pack_bf16x2(v[e + 6], v[e + 7]));
#if W_SPLIT
                *reinterpret_cast<uint4*>(Wl + buf * GM_BN * GM_LD + r * GM_LD + cl * VPC + e) =
                    make_uint4(pack_bf16x2(vl[e], vl[e + 1]), pack_bf16x2(vl[e + 2], vl[e + 3]),
                               pack_bf16x2(vl[e + 4], vl[e + 5]), pack_bf16x2(vl[e + 6], vl[e + 7]));
#endif
            }
#endif
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

    load_tile(0);
    store_tile(0, 0);
    __syncthreads();
    for (int kt = 0; kt < nkt; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < nkt) load_tile(kt + 1);
        const __nv_bfloat16* A = As + buf * GM_BM * GM_LD + (wm * 64) * GM_LD;
        const __nv_bfloat16* W = Ws + buf * GM_BN * GM_LD + (wn * 32) * GM_LD;
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; ++kk) {
            uint32_t af[4], bq[2][4];
#pragma unroll
            for (int nj = 0; nj < 2; ++nj)
                ldmatrix_x4(bq[nj], W + (nj * 16 + ((lane >> 4) << 3) + (lane & 7)) * GM_LD + kk * 16 + ((lane >> 3) & 1) * 8);
            // per accumulator, a fixed order: k16 step kk, then hi before lo
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const int aoff = (mi * 16 + (lane & 15)) * GM_LD + kk * 16 + (lane >> 4) * 8;
                ldmatrix_x4(af, A + aoff);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af, bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
#if GEMM_SPLIT
                ldmatrix_x4(af, Al + buf * GM_BM * GM_LD + (wm * 64) * GM_LD + aoff);
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
            for (int mi = 0; mi < 4; ++mi) {
                ldmatrix_x4(af, A + (mi * 16 + (lane & 15)) * GM_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af, bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
            }
#endif
        }
        if (kt + 1 < nkt) store_tile(kt + 1, buf ^ 1);
        __syncthreads();
    }

    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const long row = m0 + wm * 64 + mi * 16 + g + (h >> 1) * 8;
                const int col = n0 + wn * 32 + ni * 8 + 2 * t4 + (h & 1);
                if (row < T && col < n_out) {
                    float v = acc[mi][ni][h];
                    if (gscale) v = __fmul_rn(v, gscale[col]);
                    float* dst = out + row * n_out + col;
                    *dst = epi ? __fadd_rn(*dst, v) : v;
                }
            }
}
