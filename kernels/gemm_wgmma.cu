// gemm_wgmma.cu — the sm_90a prefill GEMMs on Hopper's warpgroup MMA (wgmma bf16 -> f32):
// gemm_wgp (x and W as bf16 planes; BF16 weights in place, other formats dequantized a row block
// at a time by dequant.cu dequant_bf16) and gemm_wra (NVFP4 / Q4_K / Q8_0 codes decoded straight
// into wgmma's register operand: the wide matrices, cuda_linear.uses_gemm_wra).
//
// Contract: gemm_common.cuh; x as bf16 planes x_hi (| x_lo) from gemm_act.cu (split_bf16, or
// act_quant under the integer-dot contract); out has row stride ldo (a row block writes its
// columns).  Both kernels give the same bits for the same planes: the same products in the same
// order per output (k tiles, k16 steps, x_hi.W, x_lo.W, x_hi.W_lo), A and B swapped.  GPU test:
// tests/gpu/test_gemm.py.
// Napkin math (Qwen3-8B layer, T = 512): 2 x 512 x (6144 + 4096 + 24576 + 4096) x 4096 = 163
// GFLOP of products per layer, x2-3 wgmmas for the hi / lo terms; the weights (~200 MB bf16,
// 57 MB as Q4_K codes) are read about once per 128- or 256-token tile: tensor-core bound
// (~1 PFLOP/s dense bf16 on an H100: ~0.5 ms per layer).
#include "wgmma.cuh"

// ---------------------------------------------------------------------------------------------
// gemm_wgp — block tile 128 tokens x WG_BN out rows x 64 k, 256 threads = 2 warpgroups,
// warpgroup w owns tokens [64w, 64w + 64) x all WG_BN rows (WG_BN / 2 accumulators per thread).
// Grid (ceil(T / 128), ceil(n_out / WG_BN)): the token tiles of one weight tile are adjacent
// block ids, so they run together and the weight tile is read from HBM once (its siblings hit
// L2).  Every operand is a plain 16-byte copy: a cp.async ring of WGP_STAGES stages straight into
// the 128-byte-swizzled tiles (1024-byte aligned), no staging registers.  Tile k+WGP_STAGES-2 is
// requested while the wgmmas of tile k run and those of tile k-1 may still be in flight
// (wait_group 1), so the tensor cores see neither the load latency nor the barrier.  W_lo =
// bf16(W - bf16(W)) comes as its own plane where W_SPLIT asks for it (WGP_WLO=1).
#ifndef WG_BN
#define WG_BN 128
#endif
#define WG_ACC (WG_BN / 2)
#define WG_W_BYTES (WG_BN * GM_BK * 2)
#ifndef WGP_STAGES
#define WGP_STAGES 4
#endif
#ifndef WGP_WLO
#define WGP_WLO 0
#endif
#define WGP_STAGE_BYTES ((1 + GEMM_SPLIT) * WG_A_BYTES + (1 + WGP_WLO) * WG_W_BYTES)
#define WGP_SMEM_BYTES (WGP_STAGES * WGP_STAGE_BYTES + 1024)  // the ring + the 1 KB alignment slack

#if WG_AVAILABLE
BW24_DEVICE void wg_mma(float (&d)[WG_ACC], uint64_t da, uint64_t db) {
#if WG_BN == 256
    wgmma_m64n256k16(d, da, db);
#else
    wgmma_m64n128k16(d, da, db);
#endif
}


// The wgmmas of one 64-wide k tile into d, in the contract's order: per k16 step (32 bytes
// further along the swizzled 128-byte rows) x_hi.W, then x_lo.W (GEMM_SPLIT; x_lo's tile
// WG_A_BYTES after x_hi's), then x_hi.W_lo (WLO; W_lo's tile WG_W_BYTES after W's).  A macro,
// not a function: as a function the k16 loop and the epilogue below were no longer unrolled (one
// GMMA instruction in a loop, accumulators indexed at run time), as macros both kernels compile
// to the SASS that was measured.
#define WG_KTILE(d, a_hi, w_hi, WLO)                                                               \
    _Pragma("unroll") for (int ks = 0; ks < GM_BK / 16; ++ks) {                                    \
        wg_mma(d, wg_desc((a_hi) + 32 * ks), wg_desc((w_hi) + 32 * ks));                           \
        if (GEMM_SPLIT) wg_mma(d, wg_desc((a_hi) + WG_A_BYTES + 32 * ks), wg_desc((w_hi) + 32 * ks)); \
        if (WLO) wg_mma(d, wg_desc((a_hi) + 32 * ks), wg_desc((w_hi) + WG_W_BYTES + 32 * ks));     \
    }

// the accumulators of warpgroup wgi (tokens m0 + 64 wgi ..) for out rows n0 .. n0 + WG_BN - 1
#define WG_EPILOGUE(d, ldo)                                                                        \
    {                                                                                              \
        const int g = lane >> 2, t4 = lane & 3;                                                    \
        const long rbase = m0 + wgi * 64 + (warp & 3) * 16 + g;                                    \
        _Pragma("unroll") for (int j = 0; j < WG_BN / 8; ++j)                                      \
        _Pragma("unroll") for (int h = 0; h < 4; ++h) {                                            \
            const long row = rbase + 8 * (h >> 1);                                                 \
            const int col = n0 + 8 * j + 2 * t4 + (h & 1);                                         \
            if (row < T && col < n_out) gemm_put(out, gscale, row, col, ldo, epi, d[4 * j + h]);   \
        }                                                                                          \
    }
#endif

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm_wgp(const uint4* __restrict__ wq, const uint4* __restrict__ wlo, const float* __restrict__ gscale,
         const __nv_bfloat16* __restrict__ xh, const __nv_bfloat16* __restrict__ xl, float* __restrict__ out,
         int T, int n_out, int n_in, int ldo, int epi) {
#if WG_AVAILABLE
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    const uint32_t sraw = (uint32_t)__cvta_generic_to_shared(smem4);
    const uint32_t sbase = (sraw + 1023u) & ~1023u;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wgi = warp >> 2;
    const long m0 = (long)blockIdx.x * GM_BM;
    const int n0 = blockIdx.y * WG_BN;
    const int nkt = (n_in + GM_BK - 1) / GM_BK, nck = n_in / 8;
    (void)xl; (void)wlo;
    // tile kt -> stage s: 16-byte unit u (8 values) of row r lands at unit u ^ (r % 8) of the row
    auto load = [&](int kt, int s) {
        const uint32_t st = sbase + s * WGP_STAGE_BYTES;
        const int c0 = kt * (GM_BK / 8);
#pragma unroll
        for (int j = 0; j < GM_BM * 8 / GM_NT; ++j) {
            const int i = tid + GM_NT * j, r = i >> 3, u = i & 7;
            const bool ok = m0 + r < T && c0 + u < nck;
            const long e = ok ? (m0 + r) * n_in + (c0 + u) * 8 : 0;
            const uint32_t d = st + r * 128 + ((u ^ (r & 7)) << 4);
            cp_async16(d, xh + e, ok);
#if GEMM_SPLIT
            cp_async16(d + WG_A_BYTES, xl + e, ok);
#endif
        }
        const uint32_t sw = st + (1 + GEMM_SPLIT) * WG_A_BYTES;
#pragma unroll
        for (int j = 0; j < WG_BN * 8 / GM_NT; ++j) {
            const int i = tid + GM_NT * j, r = i >> 3, u = i & 7;
            const bool ok = n0 + r < n_out && c0 + u < nck;
            const long e = ok ? (long)(n0 + r) * nck + c0 + u : 0;
            cp_async16(sw + r * 128 + ((u ^ (r & 7)) << 4), wq + e, ok);
#if WGP_WLO
            cp_async16(sw + WG_W_BYTES + r * 128 + ((u ^ (r & 7)) << 4), wlo + e, ok);
#endif
        }
    };

    float d[WG_ACC];
    ring_start<WGP_STAGES>(d, load, nkt);
    for (int kt = 0; kt < nkt; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(WGP_STAGES - 3) : "memory");  // tile kt landed (own copies)
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // everyone's copies landed; the wgmmas of tile kt - 2 are done everywhere
        if (kt + WGP_STAGES - 2 < nkt) load(kt + WGP_STAGES - 2, (kt + WGP_STAGES - 2) % WGP_STAGES);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const uint32_t st = sbase + (kt % WGP_STAGES) * WGP_STAGE_BYTES;
        const uint32_t a_hi = st + wgi * 64 * GM_BK * 2, w_hi = st + (1 + GEMM_SPLIT) * WG_A_BYTES;
        wg_fence_acc(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        WG_KTILE(d, a_hi, w_hi, WGP_WLO)
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        wg_fence_acc(d);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_acc(d);

    WG_EPILOGUE(d, ldo)
#else
    (void)wq; (void)wlo; (void)gscale; (void)xh; (void)xl; (void)out; (void)T; (void)n_out; (void)n_in; (void)ldo; (void)epi;
    __trap();  // sm_90a only; the wrapper launches it nowhere else
#endif
}

// ---------------------------------------------------------------------------------------------
// gemm_wra — NVFP4 / Q4_K / Q8_0 prefill with the weights as wgmma's register operand A: the
// quantized codes go from HBM to shared memory as they are (4.5 bits per weight for NVFP4), each
// thread decodes its A fragments to exact bf16 values in registers, and no dequantization pass
// writes and re-reads bf16 planes through HBM (that pass cost ~15 % of NVFP4 prefill, twice that
// for Q4_K's hi + lo planes).  The roles of gemm_wgp swap: M = 64 weight rows per warpgroup (A,
// registers), N = WRA_BT tokens (B = the x planes in shared memory, the same 128-byte-swizzled
// K-major tiles gemm_wgp reads as A).  A decoded weight value then feeds WRA_BT tokens (x2
// planes) of tensor work, so the decoding (NVFP4 ~3 instructions per value: PRMT tables; Q4_K ~7:
// a q + b in f32 and the hi / lo split) hides under the previous tile's wgmmas.
// Contract: gemm_wgp's on the integer-dot x planes (act_quant: x_hi, and x_lo when GEMM_SPLIT):
//   y[t, o] = gs[o] * sum over 64-wide k tiles, in order, of the 4 k16 steps, in order, each
//   x_hi.W, x_lo.W (GEMM_SPLIT), x_hi.W_lo (WRA_WLO) by wgmmas into the same f32 accumulators.
//   NVFP4: W[o, k] = E2M1(code) x E4M3 (its 16-value block's scale), exact in bf16 (<= 6
//   significant bits), gs the per-row global scale (epilogue).  Q4_K: W = a q + b (formats.cuh
//   decode_exact), W_hi = bf16(W), W_lo = bf16(W - W_hi) (the dequantization pass's split).  No
//   split-K: a row's values do not depend on T.  The products and their order per k16 step are
//   gemm_wgp's (A and B swapped), and the result is its bits: tests/gpu/test_gemm.py compares
//   the two bit for bit, and the kernel check with act_quant_ref(x) @ W.T.
// Geometry: block = 2 warpgroups = 128 weight rows x WRA_BT tokens (WRA_BT / 2 accumulators per
// thread); grid (ceil(T / WRA_BT), ceil(n_out / 128)): the token tiles of one row block are
// adjacent block ids (the codes are read from HBM once).  n_in a multiple of 64 (256 for Q4_K).
// Stage (1024-byte aligned): x_hi [WRA_BT][64] bf16 swizzled | x_lo (GEMM_SPLIT) | the k tile's
// codes, 128 rows x 32 bytes (two resident 16-byte chunks, formats.cuh) at a row pitch of 48
// bytes (the lanes' 4-byte reads of 8 rows and 2 words hit 16 distinct banks) | the rows'
// records (NVFP4: the scale word, k16 step s uses byte s; Q4_K: the superblock header).  A
// cp.async ring of WRA_STAGES stages; tile kt + WRA_STAGES - 2 is requested at the top of step
// kt.  Step kt issues tile kt's wgmmas from one of two named fragment sets, then waits for tile
// kt + 1 (one barrier) and decodes it into the other set while they run, then wait_group 0.
// (Decoding tile kt before its own wgmmas with wait_group 1 made ptxas serialize every wgmma,
// C7513, in all but the NVFP4 build of x split.)
#ifndef WRA_BT
#define WRA_BT 256
#endif
#ifndef WRA_STAGES
#define WRA_STAGES 3
#endif
#if WRA_BT != 128 && WRA_BT != 256
#error "WRA_BT: 128 or 256 tokens per block"
#endif
#define WRA_ACC (WRA_BT / 2)
#define WRA_ROWS 128
#define WRA_X_BYTES (WRA_BT * GM_BK * 2)
#define WRA_CPR (FMT == F_Q8_0 ? 4 : 2)  // 16-byte resident chunks per row and k tile (Q8_0: 16 values each)
#define WRA_PITCH (FMT == F_Q8_0 ? 80 : 48)  // a row's codes in the stage, padded (conflict-free 4-byte reads)
#define WRA_W_BYTES (WRA_ROWS * WRA_PITCH)
#define WRA_WLO (FMT != F_NVFP4)  // Q4_K / Q8_0: W = W_hi + W_lo, both register operands
#define WRA_REC (FMT == F_Q4_K ? 16 : 4)  // per row and k tile: NVFP4's scale word, Q8_0's two f16 scales, Q4_K's superblock header
#define WRA_STAGE_BYTES ((1 + GEMM_SPLIT) * WRA_X_BYTES + ((WRA_W_BYTES + WRA_ROWS * WRA_REC + 1023) / 1024) * 1024)
#define WRA_SMEM_BYTES (WRA_STAGES * WRA_STAGE_BYTES + 1024)  // the ring + the 1 KB alignment slack

// four E2M1 codes (the nibbles of a 16-bit selector, value j in nibble j) -> their exact values
// times 2^120 as bf16, two pairs (w01: values 0, 1; w23: values 2, 3).  Byte tables looked up
// four codes at a time with PRMT: the low and high bytes of bf16 2^120 x {0, 0.5, 1, 1.5, 2, 3,
// 4, 6}, the high byte with the sign (code 8, -0, gives +0 as the reference table does), picked
// by the code's sign bit; then the bytes interleaved into bf16 pairs.  The 2^120 is the scale's
// (wra_scale below), so that one exact bf16 product gives W.
BW24_DEVICE void e2m1x4_bf16(uint32_t sel, uint32_t& w01, uint32_t& w23) {
    const uint32_t idx = sel & 0x7777u;
    const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, idx);
    const uint32_t hp = __byte_perm(0x7B7B7B00u, 0x7C7C7C7Cu, idx);
    const uint32_t hn = __byte_perm(0xFBFBFB00u, 0xFCFCFCFCu, idx);
    const uint32_t hi = __byte_perm(hp, hn, ((sel & 0x8888u) >> 1) | 0x3210u);
    w01 = __byte_perm(lo, hi, 0x5140u);
    w23 = __byte_perm(lo, hi, 0x7362u);
}

// byte s of a row's scale word (a repacked E4M3 scale, bit 7 clear: formats.cuh) as the bf16 pair
// {v, v}, v = E4M3 x 2^-120: the 7 bits under bf16 bits 4-10 read as exactly that (E4M3's 4
// exponent bits fall in the low end of bf16's 8, bias 127 vs 7; E4M3 subnormals become bf16
// subnormals), so code x 2^120 times it is W, exact (<= 6 significant bits, a normal bf16;
// bf16 multiplication keeps subnormal operands)
BW24_DEVICE uint32_t wra_scale(uint32_t sw, int s) {
    return __byte_perm(sw, 0u, 0x4040u | (uint32_t)s | ((uint32_t)s << 8)) << 4;
}

BW24_DEVICE uint32_t bf16x2_mul(uint32_t a, uint32_t b) {  // exact here: the products fit bf16
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&r);
}

#if WG_AVAILABLE
BW24_DEVICE void wra_mma(float (&d)[WRA_ACC], const uint32_t (&a)[4], uint64_t db) {
#if WRA_BT == 256
    wgmma_ra_m64n256k16(d, a, db);
#else
    wgmma_ra_m64n128k16(d, a, db);
#endif
}
#endif

// One k tile's A fragments for this thread: h[s] (and l[s], W_lo, when WRA_WLO) = the four
// registers of k16 step s.
struct WraFrag {
    uint32_t h[4][4];
#if WRA_WLO
    uint32_t l[4][4];
#endif
};

#if FMT == F_NVFP4
// The A fragments of one k tile for this thread (warpgroup rows ra = 16 v + g and ra + 8; lane
// t = lane % 4).  Step s = 2c + h reads chunk c, half h (values 16h..16h+15 of the chunk); the
// thread's values 2t, 2t+1 sit in byte 2h + t%2 of selector word t/2, values 2t+8, 2t+9 in the
// same byte of word 2 + t/2 (formats.cuh).
BW24_DEVICE void wra_fragments(const char* codes, const void* recs, int ra, int t, int kt, WraFrag& fr) {
    (void)kt;
    const uint32_t* scales = reinterpret_cast<const uint32_t*>(recs);
    uint32_t (&f)[4][4] = fr.h;
    const int wofs = 4 * (t >> 1), p = t & 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const char* row = codes + (ra + 8 * r) * WRA_PITCH;
        const uint32_t sw = scales[ra + 8 * r];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const uint32_t qa = *reinterpret_cast<const uint32_t*>(row + 16 * c + wofs);
            const uint32_t qb = *reinterpret_cast<const uint32_t*>(row + 16 * c + 8 + wofs);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int s = 2 * c + h;
                const uint32_t b = 2 * h + p;
                uint32_t w01, w23;
                e2m1x4_bf16(__byte_perm(qa, qb, b | ((4 + b) << 4)), w01, w23);
                const uint32_t sc = wra_scale(sw, s);
                f[s][r] = bf16x2_mul(w01, sc);
                f[s][2 + r] = bf16x2_mul(w23, sc);
            }
        }
    }
}
#else
// The integer-coded formats (Q4_K, Q8_0) share the fragment plumbing: the thread's bytes 2t, 2t+1
// and 2t+8, 2t+9 of a 16-byte chunk (words t/2 and 2 + t/2, picked into one word), and the split
// of four exact values into W_hi (and W_lo) registers of step s, rows ra (r = 0) / ra + 8 (r = 1).
BW24_DEVICE uint32_t wra_pick(int t) {  // the PRMT selector of wra_bytes for lane t % 4
    const uint32_t p = 2 * (t & 1);
    return p | ((p + 1) << 4) | ((p + 4) << 8) | ((p + 5) << 12);
}

BW24_DEVICE uint32_t wra_bytes(const char* chunk, int wofs, uint32_t pick) {  // wofs = 4 * (t / 2)
    return __byte_perm(*reinterpret_cast<const uint32_t*>(chunk + wofs), *reinterpret_cast<const uint32_t*>(chunk + 8 + wofs), pick);
}

BW24_DEVICE void wra_put(WraFrag& f, int s, int r, float4 v) {
    uint2 hi, lo;
    split_bf16x4(v, hi, lo);
    f.h[s][r] = hi.x;
    f.h[s][2 + r] = hi.y;
#if WRA_WLO
    f.l[s][r] = lo.x;
    f.l[s][2 + r] = lo.y;
#endif
}
#endif

#if FMT == F_Q4_K
// Q4_K: the same values of a nibble chunk (byte j: value j in the low nibble, 16 + j in the high
// one), each W = a q + b exactly as formats.cuh decode_exact (chunk_scales from the superblock
// header), then split as the dequantization pass splits it (split_bf16x4: W_hi = bf16(W), W_lo =
// bf16(W - W_hi)).  Step s = 2c + h: chunk c, nibble h; the thread's values 2t, 2t+1, 2t+8, 2t+9
// are bytes 2t, 2t+1 of word t/2 and the same bytes of word 2 + t/2.
BW24_DEVICE void wra_fragments(const char* codes, const void* recs, int ra, int t, int kt, WraFrag& f) {
    const int wofs = 4 * (t >> 1);
    const uint32_t pick = wra_pick(t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const char* row = codes + (ra + 8 * r) * WRA_PITCH;
        Raw raw;
        raw.s = reinterpret_cast<const uint4*>(recs)[ra + 8 * r];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float a0, a1, b;
            chunk_scales(raw, 2 * kt + c, a0, a1, b);
            (void)a1;
            const uint32_t w4 = wra_bytes(row + 16 * c, wofs, pick);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t q4 = (h ? w4 >> 4 : w4) & 0x0F0F0F0Fu;
                wra_put(f, 2 * c + h, r, make_float4(wexact(a0, qval(q4, 0), b), wexact(a0, qval(q4, 1), b),
                                                     wexact(a0, qval(q4, 2), b), wexact(a0, qval(q4, 3), b)));
            }
        }
    }
}
#elif FMT == F_Q8_0
// Q8_0: step s reads chunk s (16 int8 values, scale s / 2 of the k tile's two f16 scales); the
// thread's values 2t, 2t+1, 2t+8, 2t+9 are bytes 2t, 2t+1 of word t/2 and of word 2 + t/2; each
// W = q d exactly as decode_exact, split as the dequantization pass splits it.
BW24_DEVICE void wra_fragments(const char* codes, const void* recs, int ra, int t, int kt, WraFrag& f) {
    (void)kt;
    const int wofs = 4 * (t >> 1);
    const uint32_t pick = wra_pick(t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const char* row = codes + (ra + 8 * r) * WRA_PITCH;
        const uint32_t sw = reinterpret_cast<const uint32_t*>(recs)[ra + 8 * r];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const float a = f16_bits_to_f32((uint16_t)(s < 2 ? sw & 0xFFFFu : sw >> 16));
            const uint32_t w4 = wra_bytes(row + 16 * s, wofs, pick) ^ 0x80808080u;  // int8 -> int8 + 128 (qval's QOFF)
            wra_put(f, s, r, make_float4(__fmul_rn(qval(w4, 0), a), __fmul_rn(qval(w4, 1), a),
                                         __fmul_rn(qval(w4, 2), a), __fmul_rn(qval(w4, 3), a)));
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm_wra(const uint4* __restrict__ wq, const uint32_t* __restrict__ ws, const float* __restrict__ gscale,
         const __nv_bfloat16* __restrict__ xh, const __nv_bfloat16* __restrict__ xl, float* __restrict__ out,
         int T, int n_out, int n_in, int ldo, int epi) {
#if WG_AVAILABLE && (FMT == F_NVFP4 || FMT == F_Q4_K || FMT == F_Q8_0)
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    const uint32_t sraw = (uint32_t)__cvta_generic_to_shared(smem4);
    const uint32_t sbase = (sraw + 1023u) & ~1023u;
    const char* gbase = reinterpret_cast<const char*>(smem4) + (sbase - sraw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wgi = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const long m0 = (long)blockIdx.x * WRA_BT;
    const int n0 = blockIdx.y * WRA_ROWS;
    const int nkt = n_in / GM_BK, nck = n_in / VPC, nsw = n_in / 64;
    (void)xl;
    constexpr int XP = (1 + GEMM_SPLIT) * WRA_X_BYTES;  // the codes' offset in a stage
    // Per-thread copy geometry, fixed for the whole k loop (64-bit addresses and bounds per copy
    // and k tile would be ~200 of ~470 instructions per tile).  x: rows
    // xr + 32 j (j < WRA_BT / 32), 16-byte unit xu; the x planes are readable up to the last
    // token tile's end (cuda_linear pads their scratch), and rows past T hold whatever is there:
    // a token (a column of B) only reaches its own outputs, which are not stored.  Codes and
    // records below; rows past n_out read the last row (a row of A only reaches its own outputs).
    const int xr = tid >> 3, xu = tid & 7;
    const uint32_t xdst = xr * 128 + ((xu ^ (xr & 7)) << 4);
    const char* xsrc = reinterpret_cast<const char*>(xh + (m0 + xr) * n_in + xu * 8);
    const long xstep = 64L * n_in;  // bytes from row r to row r + 32
    const long xl_off = GEMM_SPLIT ? (long)(reinterpret_cast<const char*>(xl) - reinterpret_cast<const char*>(xh)) : 0;
    // codes: chunk tid % WRA_CPR of row tid / WRA_CPR (Q8_0, 4 chunks per row: and of that row + 64)
#if WRA_CPR == 2
    const uint4* wsrc = wq + (long)min(n0 + (tid >> 1), n_out - 1) * nck + (tid & 1);
#else
    const uint4* wsrc = wq + (long)min(n0 + (tid >> 2), n_out - 1) * nck + (tid & 3);
    const uint4* wsrc64 = wq + (long)min(n0 + (tid >> 2) + 64, n_out - 1) * nck + (tid & 3);
#endif
    // records of row tid (tid < 128): NVFP4 one scale word per k tile, Q8_0 its two f16 scales,
    // Q4_K one 16-byte header per 4 k tiles
    // (every format's record plane has n_in / 16 bytes per row, n_in a multiple of 64)
    const char* ssrc = reinterpret_cast<const char*>(ws) + (long)min(n0 + (tid & (WRA_ROWS - 1)), n_out - 1) * (nsw * 4);
    const uint32_t wdst = XP + (tid >> (WRA_CPR == 2 ? 1 : 2)) * WRA_PITCH + 16 * (tid & (WRA_CPR - 1)), sdst = XP + WRA_W_BYTES + WRA_REC * tid;
    auto load = [&](int kt, int s) {
        const uint32_t st = sbase + s * WRA_STAGE_BYTES;
        const char* src = xsrc + kt * (GM_BK * 2);
#pragma unroll
        for (int j = 0; j < WRA_BT / 32; ++j, src += xstep) {
            cp_async16(st + xdst + j * 32 * 128, src, true);
#if GEMM_SPLIT
            cp_async16(st + xdst + j * 32 * 128 + WRA_X_BYTES, src + xl_off, true);
#endif
        }
        cp_async16(st + wdst, wsrc + WRA_CPR * kt, true);
#if WRA_CPR == 4
        cp_async16(st + wdst + 64 * WRA_PITCH, wsrc64 + WRA_CPR * kt, true);
#endif
#if FMT != F_Q4_K
        if (tid < WRA_ROWS) asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(st + sdst), "l"(ssrc + 4 * kt) : "memory");
#else
        if (tid < WRA_ROWS) cp_async16(st + sdst, ssrc + 16 * (kt >> 2), true);
#endif
    };

    float d[WRA_ACC];
    ring_start<WRA_STAGES>(d, load, nkt);
    const int ra = 64 * wgi + 16 * (warp & 3) + g;
    // the fragments of tile kt from its stage, complete before the next wgmma fence (ptxas
    // serializes wgmmas whose input registers it sees defined inside their pipeline stage: C7513)
    auto decode = [&](int kt, WraFrag& f) {
        const char* sg = gbase + (kt % WRA_STAGES) * WRA_STAGE_BYTES;
        wra_fragments(sg + XP, sg + XP + WRA_W_BYTES, ra, t, kt, f);
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                asm volatile("" : "+r"(f.h[s][i])::"memory");
#if WRA_WLO
                asm volatile("" : "+r"(f.l[s][i])::"memory");
#endif
            }
    };
    // everyone's copies of tile kt landed and are visible to the async proxy (wgmma)
    auto tile_ready = [&]() {
        asm volatile("cp.async.wait_group %0;" ::"n"(WRA_STAGES - 3) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
    };
    // One k tile: request tile kt + WRA_STAGES - 2 (its stage held tile kt - 2, whose wgmmas every
    // warp retired before the barrier of step kt - 1), issue tile kt's wgmmas from f, then, while
    // they run, wait for tile kt + 1 and decode it into `next`, and retire tile kt (wait_group 0:
    // f is free for tile kt + 2).  One barrier per tile.
    auto step = [&](int kt, WraFrag& f, WraFrag& next) {
        if (kt + WRA_STAGES - 2 < nkt) load(kt + WRA_STAGES - 2, (kt + WRA_STAGES - 2) % WRA_STAGES);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const uint32_t st = sbase + (kt % WRA_STAGES) * WRA_STAGE_BYTES;
        uint64_t dh[4], dl[4];  // the x planes' descriptors, also defined before the fence
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            dh[s] = wg_desc(st + 32 * s);
            dl[s] = wg_desc(st + WRA_X_BYTES + 32 * s);
            asm volatile("" : "+l"(dh[s]), "+l"(dl[s])::"memory");
        }
        wg_fence_acc(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < GM_BK / 16; ++s) {
            wra_mma(d, f.h[s], dh[s]);  // the contract's order: x_hi.W, x_lo.W, then x_hi.W_lo
            if (GEMM_SPLIT) wra_mma(d, f.h[s], dl[s]);
#if WRA_WLO
            wra_mma(d, f.l[s], dh[s]);
#endif
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (kt + 1 < nkt) {
            tile_ready();
            decode(kt + 1, next);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        wg_fence_acc(d);
    };
    WraFrag fa, fb;
    tile_ready();
    decode(0, fa);
    for (int kt = 0; kt < nkt; kt += 2) {  // unrolled by two: the register sets are named, not indexed
        step(kt, fa, fb);
        if (kt + 1 < nkt) step(kt + 1, fb, fa);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_acc(d);

    // d[4j + 2h + e] = (weight row 16v + g + 8h of the warpgroup's 64, token 8j + 2t + e)
#pragma unroll
    for (int j = 0; j < WRA_BT / 8; ++j)
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            const long tok = m0 + 8 * j + 2 * t + (h & 1);
            const int row = n0 + ra + 8 * (h >> 1);
            if (tok < T && row < n_out) gemm_put(out, gscale, tok, row, ldo, epi, d[4 * j + h]);
        }
#else
    (void)wq; (void)ws; (void)gscale; (void)xh; (void)xl; (void)out; (void)T; (void)n_out; (void)n_in; (void)ldo; (void)epi;
    __trap();  // NVFP4 / Q4_K / Q8_0 on sm_90a only: the wrapper launches it nowhere else
#endif
}
