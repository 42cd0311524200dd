// gemm_i8.cu — the Q8_0 prefill on the integer-dot contract: x quantized per 32-block into
// two int8 code levels (gemm_act.cu act_quant_qx: the QX rows of common.cuh), the weights' code
// bytes as they are, exact int32 block dots on integer tensor cores.  gemm_i8: Hopper's int8
// wgmma (sm_90a; the 4096-row matrices, the wide ones take gemm_wgmma.cu gemm_wra); gemm_i8_mma:
// mma.sync m16n8k32 s8 (every other GPU), the same rows bit for bit.
//
// Contract (both kernels): y[t, o] = sum over 32-blocks b, in k order, of
//   float(256 H + L) * (d[o, b] * 2^(e[t, b] - 8)), H / L = the block's int32 dots of the weight
//   codes with x's high / low codes, d the block's f16 scale, e x's block exponent; out (= or +=)
//   y with row stride ldo.  NumPy reference: act_quant_ref(x) @ W.T (kernel_refs); GPU test:
//   tests/gpu/test_gemm.py.  Agreement with the decode matvec ~1e-7 (it sums chunks per lane).
// Napkin math (Qwen3-8B o + down, T = 512): 2 x 512 x 4096 x (4096 + 12288) = 69 GFLOP as int8
// (2 levels: x2), over 17 MB of codes: compute-bound; the per-block fold (~5 issue slots per
// output and block) is the limit, not the int8 tensor rate.
#include "wgmma.cuh"

// ---------------------------------------------------------------------------------------------
// gemm_i8 — Q8_0 prefill on Hopper's integer warpgroup MMA (sm_90a).  The integer-dot contract exactly as the
// decode matvec sees it: x quantized per 32-block into two code levels (the QX rows that
// act_quant_qx below writes, common.cuh's layout), the weights' resident code bytes as they are
// (signed int8 codes, cuda_weights: Q8_0 "q" plane) — no dequantization pass, no bf16 split.
//   y[t, o] = sum over 32-blocks b, in k order, of  float(256 H + L) * (d[o, b] * 2^(e[t, b] - 8))
//   H = sum_k q[o, k] h[t, k] and L = sum_k q[o, k] l[t, k]: exact int32 (wgmma s8 x s8; |256 H +
//   L| < 2^28); d = the block's f16 scale; the scale product is exact (f16 times a power of
//   two), then one I2F rounding and one FMA per block: the float products the decode matvec forms
//   per level and chunk, joined per block (agreement ~1e-7 relative, not bit-identical: the decode
//   sums chunks per lane, then warp_sum).  No split-K: a row's values do not depend on T.
//   NumPy reference: act_quant_ref(x) @ W.T (tests/gpu/test_gemm.py).
// Why: the bf16 split runs three bf16 wgmmas per k16 step on dequantized tiles; here two int8
// wgmmas per k32 step read the raw bytes, and the cost moves to the per-block fold (~5 issue
// slots per output and block: IMAD, I2FP, FMUL, FFMA and the scale's load).  Measured faster
// (docs/performance.md); the fold's issue and latency bound the kernel, not L2 or DRAM.
// Geometry: block tile 128 tokens (2 warpgroups x 64) x I8_BN = 64 out rows x a k tile of 128 (4
// blocks), 256 threads; grid (ceil(T / 128), ceil(n_out / 64)); n_in a multiple of 128.  A stage:
// x h and l tiles (128 rows x 128 bytes), the W tile (64 x 128 bytes), all 128-byte-swizzled
// (same descriptors as the bf16 kernels: a 32-byte k step is 16 bf16 or 32 int8), the x records
// (128 tokens x 4 blocks x 16 B) and the W scales (64 rows x 4 f16), one cp.async ring of
// I8_STAGES stages.  Per block of the k tile: wgmma H, wgmma L (scale-d 0: fresh int32
// accumulators), commit, wait, fold into the f32 accumulators.
#define I8_BN 64
#define I8_BK 128
#define I8_A_BYTES (GM_BM * I8_BK)
#define I8_W_BYTES (I8_BN * I8_BK)
#define I8_REC_BYTES (GM_BM * 4 * 16)
#define I8_SC_BYTES (I8_BN * 4 * 2)
#define I8_STAGE_BYTES ((2 * I8_A_BYTES + I8_W_BYTES + I8_REC_BYTES + I8_SC_BYTES + 1023) / 1024 * 1024)
#define I8_STAGES 4
// The k tile's 64 x 4 f16 weight scales are converted once to f32 ([block][row], 1 KB after the
// ring) by one thread each, behind a second barrier per tile, so the fold reads a column pair's
// two scales with one LDS.64 instead of two LDS.U16 + two HADD2.F32 per column (~15 % fewer fold
// instructions, the same values).
#define I8_SMEM_BYTES (I8_STAGES * I8_STAGE_BYTES + 1024 + I8_BN * 4 * 4)  // ring, 1 KB alignment slack, f32 scales
#if WG_AVAILABLE
// wgmma m64n64k32 s8 (A: x codes, K-major) x s8 (B: weight codes, K-major) -> s32; scale_d 0: D = A.B
BW24_DEVICE void wgmma_m64n64k32_s8(int (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p; }"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                   "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

BW24_DEVICE void i8_fence_acc(int (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

BW24_DEVICE void cp_async8(uint32_t dst, const void* src, bool full) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(full ? 8 : 0) : "memory");
}
#endif

extern "C" __global__ void __launch_bounds__(GM_NT, 1)
gemm_i8(const uint8_t* __restrict__ wq, const uint16_t* __restrict__ wsc, const uint32_t* __restrict__ qx,
        float* __restrict__ out, int T, int n_out, int n_in, int ldo, int epi) {
#if WG_AVAILABLE && FMT == F_Q8_0
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    const uint32_t sraw = (uint32_t)__cvta_generic_to_shared(smem4);
    const uint32_t sbase = (sraw + 1023u) & ~1023u;
    const char* gbase = reinterpret_cast<const char*>(smem4) + (sbase - sraw);  // generic view of sbase
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wgi = warp >> 2;
    const long m0 = (long)blockIdx.x * GM_BM;
    const int n0 = blockIdx.y * I8_BN;
    const int nkt = n_in / I8_BK, nb = n_in / 32;
    const long qx_row = qx_row_words(n_in);  // words per token
    // tile kt -> stage s (x: h plane at byte 0 of the QX row, l plane at byte n_in; records at
    // word n_in / 2; 16-byte unit u of row r lands at unit u ^ (r % 8))
    auto load = [&](int kt, int s) {
        const uint32_t st = sbase + s * I8_STAGE_BYTES;
#pragma unroll
        for (int j = 0; j < GM_BM * 8 / GM_NT; ++j) {
            const int i = tid + GM_NT * j, r = i >> 3, u = i & 7;
            const bool ok = m0 + r < T;
            const char* src = reinterpret_cast<const char*>(qx + (ok ? (m0 + r) * qx_row : 0)) + kt * I8_BK + u * 16;
            const uint32_t d = st + r * 128 + ((u ^ (r & 7)) << 4);
            cp_async16(d, src, ok);
            cp_async16(d + I8_A_BYTES, src + n_in, ok);
        }
#pragma unroll
        for (int j = 0; j < I8_BN * 8 / GM_NT; ++j) {
            const int i = tid + GM_NT * j, r = i >> 3, u = i & 7;
            const bool ok = n0 + r < n_out;
            cp_async16(st + 2 * I8_A_BYTES + r * 128 + ((u ^ (r & 7)) << 4), wq + (ok ? (long)(n0 + r) * n_in : 0) + kt * I8_BK + u * 16, ok);
        }
#pragma unroll
        for (int j = 0; j < GM_BM * 4 / GM_NT; ++j) {  // records: token r, block kb at (r * 4 + kb) * 16
            const int i = tid + GM_NT * j, r = i >> 2, kb = i & 3;
            const bool ok = m0 + r < T;
            cp_async16(st + 2 * I8_A_BYTES + I8_W_BYTES + i * 16, qx + (ok ? (m0 + r) * qx_row : 0) + n_in / 2 + 4 * (kt * 4 + kb), ok);
        }
        if (tid < I8_BN) {  // scales: row r's 4 f16 of the k tile (8 bytes: nb % 4 == 0)
            const bool ok = n0 + tid < n_out;
            cp_async8(st + 2 * I8_A_BYTES + I8_W_BYTES + I8_REC_BYTES + tid * 8, wsc + (ok ? (long)(n0 + tid) * nb : 0) + kt * 4, ok);
        }
    };

    float acc[32];
    int ih[32], il[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) { acc[i] = 0.0f; ih[i] = 0; il[i] = 0; }
#pragma unroll
    for (int s = 0; s < I8_STAGES - 1; ++s) {
        if (s < nkt) load(s, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const int g = lane >> 2, t4 = lane & 3;
    const int r0 = wgi * 64 + (warp & 3) * 16 + g;  // this thread's token rows r0, r0 + 8 of the tile
    for (int kt = 0; kt < nkt; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(I8_STAGES - 2) : "memory");  // tile kt landed (own copies)
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // everyone's copies landed; every read of tile kt - 1's stage is done (wait 0 below)
        if (kt + I8_STAGES - 1 < nkt) load(kt + I8_STAGES - 1, (kt + I8_STAGES - 1) % I8_STAGES);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const int s = kt % I8_STAGES;
        const uint32_t st = sbase + s * I8_STAGE_BYTES;
        const int4* rec = reinterpret_cast<const int4*>(gbase + s * I8_STAGE_BYTES + 2 * I8_A_BYTES + I8_W_BYTES);
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(gbase + s * I8_STAGE_BYTES + 2 * I8_A_BYTES + I8_W_BYTES + I8_REC_BYTES);
        const uint32_t a_h = st + wgi * 64 * 128, w_t = st + 2 * I8_A_BYTES;
        static_assert(I8_BN * 4 == GM_NT, "one scale per thread");
        float* sc32 = reinterpret_cast<float*>(reinterpret_cast<char*>(smem4) + (sbase - sraw) + I8_STAGES * I8_STAGE_BYTES);
        sc32[(tid >> 6) * I8_BN + (tid & 63)] = f16_bits_to_f32(sc[(tid & 63) * 4 + (tid >> 6)]);  // every fold of kt - 1 is done (barrier above)
        __syncthreads();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            i8_fence_acc(ih);
            i8_fence_acc(il);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wgmma_m64n64k32_s8(ih, wg_desc(a_h + 32 * kb), wg_desc(w_t + 32 * kb), 0);
            wgmma_m64n64k32_s8(il, wg_desc(a_h + I8_A_BYTES + 32 * kb), wg_desc(w_t + 32 * kb), 0);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            // the fold's per-row factor while the wgmmas run: 2^(e - 8) (the record's exponent)
            float p[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) p[h] = pow2f(rec[(r0 + 8 * h) * 4 + kb].x - 8);
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            i8_fence_acc(ih);
            i8_fence_acc(il);
#pragma unroll
            for (int j = 0; j < I8_BN / 8; ++j) {
                const float2 dw2 = *reinterpret_cast<const float2*>(sc32 + kb * I8_BN + 8 * j + 2 * t4);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float dw = e ? dw2.y : dw2.x;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = 4 * j + 2 * h + e;
                        const int v = 256 * ih[i] + il[i];
                        acc[i] = __fmaf_rn((float)v, __fmul_rn(dw, p[h]), acc[i]);
                    }
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int j = 0; j < I8_BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            const long row = m0 + r0 + 8 * (h >> 1);
            const int col = n0 + 8 * j + 2 * t4 + (h & 1);
            if (row < T && col < n_out) gemm_put(out, nullptr, row, col, ldo, epi, acc[4 * j + h]);
        }
#else
    (void)wq; (void)wsc; (void)qx; (void)out; (void)T; (void)n_out; (void)n_in; (void)ldo; (void)epi;
    __trap();  // sm_90a with FMT=Q8_0 only; the wrapper launches it nowhere else
#endif
}

// ---------------------------------------------------------------------------------------------
// gemm_i8_mma — gemm_i8's contract on the portable integer MMA (mma.sync.m16n8k32 s8 x s8 ->
// s32, sm_80 and later: sm_86 / sm_89 / sm_120 and the forced portable path on Hopper): the block
// of gemm_i8_mma.cuh, the same formula in the same order per output and the same fold
// instructions, so its rows equal gemm_i8's bit for bit (tests/gpu/test_gemm.py) and follow the
// decode matvec to ~1e-7.  Why: the bf16 split this path took before drops x_lo . W_lo; for Q8_0
// that left the prefill rows 1.6e-5 to 4.2e-5 (relative) from the decode's, enough for the tiny
// check model's prefill-vs-decode gate to fail on the portable path.
// Geometry: block tile 128 tokens x 64 out rows (I8Tile<4>: 8 warps as 4 x 2), grid (ceil(T /
// 128), ceil(n_out / 64)); n_in a multiple of 64.
#include "gemm_i8_mma.cuh"
#define IM_BM 128
#define IM_BN 64
#define IM_SMEM_BYTES (IM_STAGES * IM_STAGE_BYTES_FOR(IM_BM, IM_BN))  // cuda_linear.gemm_i8_mma_smem (tests/test_smem_contract.py)

extern "C" __global__ void __launch_bounds__(GM_NT, 1)
gemm_i8_mma(const uint8_t* __restrict__ wq, const uint16_t* __restrict__ wsc, const uint32_t* __restrict__ qx,
            float* __restrict__ out, int T, int n_out, int n_in, int ldo, int epi) {
#if FMT == F_Q8_0
    PDL_ENTRY();
    extern __shared__ float4 smem4[];
    using G = I8Tile<4>;
    static_assert(G::BM == IM_BM && G::BN == IM_BN, "the wrapper's tile");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / G::WN, wn = warp % G::WN;
    const long m0 = (long)blockIdx.x * IM_BM;
    const int n0 = blockIdx.y * IM_BN;
    const DenseRows rows{m0, T};
    float acc[2][4][4];
    gemm_i8_mma_tile<4, false>(acc, wq, wsc, qx, rows, rows, n_out, n_in, n0, smem4, IM_BM);
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const long row = m0 + wm * 32 + mi * 16 + g + 8 * (h >> 1);
                const int col = n0 + wn * 32 + ni * 8 + 2 * t4 + (h & 1);
                if (row < T && col < n_out) gemm_put(out, nullptr, row, col, ldo, epi, acc[mi][ni][h]);
            }
#else
    (void)wq; (void)wsc; (void)qx; (void)out; (void)T; (void)n_out; (void)n_in; (void)ldo; (void)epi;
    __trap();  // FMT=Q8_0 only; the wrapper launches it nowhere else
#endif
}
