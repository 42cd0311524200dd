// deltanet_chunk.cu — the gated delta rule's prefill in the chunked (WY / UT-transform) form
// (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks", arXiv:2412.06464, sec. 3; the
// decomposition of flash-linear-attention's chunk_gated_delta_rule: chunk-local cumulative gates,
// the scaled K K^T, its triangular inverse, W and U, the state pass, the output).  The same
// function as deltanet.cu's recurrence up to rounding, on tensor cores.
//
// Shape legend: T rows of a prefill pass, Hk key heads, Hv value heads (a multiple of Hk), DK key
// head dim (DKP: padded to 32), DV value head dim (DVP: padded to 32), chunks of GDN_CHUNK = 64
// rows counted from the pass's first row (the last may be shorter).  The runner starts passes at
// multiples of 64 rows from a prefill call's first row, so the chunks do not depend on how a
// call is split into passes (cuda_deltanet.prefill).
//
// Contract (NumPy reference: numpy_backend.gated_delta_rule_chunked_ref, which states the
// algebra): per chunk and value head h (key head kh = h / (Hv / Hk), or h % Hk "tiled"), with S the
// state (DK x DV) before the chunk:
//   q, k, beta, g of each row exactly as deltanet_recurrent computes them (deltanet_common.cuh);
//   gam = the inclusive prefix sum of g over the chunk (a fixed shuffle scan, in float64);
//   A[t, s] = beta_t exp(gam_t - gam_s) (k_t . k_s) (s < t);  Tm = (I + A)^-1;
//   W = Tm diag(beta exp(gam)) K;  U~ = Tm diag(beta) V;  M[t, s] = exp(gam_t - gam_s) (q_t . k_s) (s <= t);
//   U = U~ - W S;  O = diag(exp(gam)) (Q S) + M U;  S = exp(gam_last) S + K^T diag(exp(gam_last - gam)) U.
// Exponents are differences gam_t - gam_s (s <= t) or gam itself: <= 0, nothing overflows.
// Precision: every matrix product on TF32 tensor cores as three products of hi / lo TF32 halves
// (hi x lo, lo x hi, hi x hi: float32-grade; the rows' inputs are float32 and the state
// must stay accurate for decode to continue from it; tests: rel ~1e-6 against float64); the
// triangular inverse on CUDA cores in float32.  Reduction order: fixed by the code (the MMA k-steps
// in order, the inverse's sums in index order), never by T, the grid or timing; no atomics.
//
// Two kernels per pass:
//   deltanet_chunk_prep  grid (chunks, Hv), 4 warps: one chunk of one head, all in shared memory:
//     q, k normalized, beta, gam; K K^T and Q K^T (the lower 20 of the 32 16x8 tiles); Tm by 16 x 16
//     blocks (the diagonal blocks by forward substitution, a warp each; then one block-diagonal at a
//     time: T_IJ = -T_II sum_K A_IK T_KJ); W and U~ (v in 32-column pieces).  Writes the record of
//     (chunk, h) to the workspace: W (64 x DKP) | U~ (64 x DVP) | M (64 x 64) | exp(gam) (64) |
//     exp(gam_last - gam) (64); and, from one value head per key head, the normalized q | k
//     (64 x DKP each) of (chunk, kh).  Rows past T: zeros (their beta = g = 0), so they add nothing.
//   deltanet_chunk_state grid (DVP / CH_BV, Hv), 4 warps: CH_BV columns of one head's state, the
//     chunks in order.  S in registers (a warp's 16-row tiles of DK, accumulator layout) and mirrored
//     in shared memory (the B operand).  A chunk is four phases, each on one record part streamed by
//     cp.async into one of two slots while the previous phase computes: W (U = U~ - W S, the warp's
//     16 rows) | Q (exp(gam) Q S) | M (O = that + M U; rows < T stored) | K (the state update).
//
// Workspace (cuda_deltanet.chunk_workspace_shapes): records of (chunk, h) then of (chunk, kh),
// float32; the pass's records are rewritten by each layer (layers run in order on one stream).
//
// Napkin math (Qwen3.5-9B: Hk 16, Hv 32, DK = DV = 128; a pass of 512 rows = 8 chunks):
//   FLOPs per chunk and head: K K^T + Q K^T 2 x 0.5 M (lower half), W and U~ 2 x 1.0 M, W S and Q S
//   2 x 2.1 M, M U 0.5 M, K^T U 2.1 M: ~10 MFLOP, x3 for the TF32 halves = 30 MFLOP; 256 (chunk, head)
//   pairs = 7.7 GFLOP a layer for 512 rows, 0.19 TFLOP for the model: ~0.5 ms at a third of the
//   mma.sync TF32 rate (~400 TFLOP/s on an H100): ~2.5 % of a 20 ms pp512 (the GEMMs: 14.4 GFLOP a
//   token).  Bytes: the records, 147 KB per (chunk, head) written once, ~38 MB a layer at 512 rows
//   (L2-resident on H100 / H200), read DVP / CH_BV = 8 times by the state pass (W, Q, K, M: 112 KB a
//   chunk a block): ~0.24 GB of L2 reads a layer, ~40 us at ~6 TB/s, which the two-slot pipeline
//   overlaps with the phases' MMAs.  The sequential part is the state pass: 8 chunks x 4 phases.
//   The recurrence instead walks the 512 rows one by one (~300 cycles a row, a dependent chain).
//   Bound aimed at: the state pass's L2 reads and MMA issue, ~20-40 us a layer, < 1 ms for pp512.
//
// Shared memory: deltanet_chunk_prep PREP_SMEM_FLOATS (84 KB at DK = 128), deltanet_chunk_state
// STATE_SMEM_FLOATS (93 KB at DK = 128, CH_BV = 16: within sm_120's 99 KB; two blocks an SM on
// sm_90).  DK = 256 needs 148 KB / 165 KB: sm_90 only (cuda_deltanet.chunked_rows).
//
// Defines: DK (key head dim, <= 256), CH_BV (state columns per block: 8, 16 or 32; tuning.py
// DELTANET_CHUNK_BV).
#include "deltanet_common.cuh"

#ifndef CH_BV
#define CH_BV 16
#endif

#define GDN_CHUNK 64
#define CH_WARPS 4
#define CH_THREADS (CH_WARPS * 32)
#define LDK (DKP + 4)               // rows of 64 x DKP tiles (= 4 mod 32: A-fragment reads conflict-free)
#define LDM (GDN_CHUNK + 4)         // rows of 64 x 64 tiles
#define LDU (CH_BV + 8)             // rows of 64 x CH_BV tiles (B-fragment reads conflict-free)
#define LDV 40                      // rows of the prep's 32-column pieces of v
#define NTB (CH_BV / 8)             // n-tiles of the state pass's columns
#define MT (DKP / 16)               // 16-row tiles of DK
#define MTW ((MT + CH_WARPS - 1) / CH_WARPS)  // of them per warp
#define NTW (DKP / 32)              // n-tiles of W per warp (DKP / 8 over 4 warps)

static_assert(CH_BV == 8 || CH_BV == 16 || CH_BV == 32, "CH_BV: 8, 16 or 32");

// prep: K | Q, later the inverse T and the X blocks | A, later the v pieces | beta, gam, e^gam, e^(last-gam), beta e^gam
#define PREP_QT (64 * LDK > 64 * LDM + 768 ? 64 * LDK : 64 * LDM + 768)
#define PREP_SMEM_FLOATS (64 * LDK + PREP_QT + 64 * LDM + 5 * 64)
// state: two slots of (the 64-row part | U~ tile | e^gam | e^(last-gam)), U, S (CH_BV x LDK)
#define ST_MAIN (LDK > LDM ? 64 * LDK : 64 * LDM)
#define ST_SLOT (ST_MAIN + 64 * LDU + 128)
#define STATE_SMEM_FLOATS (2 * ST_SLOT + 64 * LDU + CH_BV * LDK)

// ============================================================================ TF32 MMA, float32-grade
struct FragA {
    uint32_t hi[4], lo[4];
};
struct FragB {
    uint32_t hi[2], lo[2];
};

// x = hi + lo + O(2^-22 x): hi = x rounded to TF32, lo = the rest rounded to TF32 (x - hi is exact)
BW24_DEVICE void tf32_split(float x, uint32_t& hi, uint32_t& lo) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    const float r = __fsub_rn(x, __uint_as_float(hi));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(r));
}

BW24_DEVICE void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a b: the small cross terms first, then hi x hi (the lo x lo term, ~2^-22, is dropped)
BW24_DEVICE void mma3(float (&c)[4], const FragA& a, const FragB& b) {
    mma_tf32(c, a.lo, b.hi);
    mma_tf32(c, a.hi, b.lo);
    mma_tf32(c, a.hi, b.hi);
}

// The m16n8k8 fragments (PTX ISA, "Matrix fragments for mma.m16n8k8", .tf32), g = lane / 4,
// t = lane % 4:  A (16 x 8) a0 (g, t) a1 (g + 8, t) a2 (g, t + 4) a3 (g + 8, t + 4);
// B (8 x 8) b0 (t, g) b1 (t + 4, g);  C (16 x 8) c0 (g, 2t) c1 (g, 2t + 1) c2 (g + 8, 2t) c3 (g + 8, 2t + 1).
// The operands come from accessors at(row, col), so that a transposed or scaled operand is read in place.
template <class F>
BW24_DEVICE FragA frag_a(F at, int r0, int k0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    FragA f;
    tf32_split(at(r0 + g, k0 + t), f.hi[0], f.lo[0]);
    tf32_split(at(r0 + g + 8, k0 + t), f.hi[1], f.lo[1]);
    tf32_split(at(r0 + g, k0 + t + 4), f.hi[2], f.lo[2]);
    tf32_split(at(r0 + g + 8, k0 + t + 4), f.hi[3], f.lo[3]);
    return f;
}

template <class F>
BW24_DEVICE FragB frag_b(F at, int k0, int n0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    FragB f;
    tf32_split(at(k0 + t, n0 + g), f.hi[0], f.lo[0]);
    tf32_split(at(k0 + t + 4, n0 + g), f.hi[1], f.lo[1]);
    return f;
}

// row and column of accumulator element e of the 16 x 8 tile at (r0, n0)
BW24_DEVICE int c_row(int r0, int e, int lane) { return r0 + (lane >> 2) + 8 * (e >> 1); }
BW24_DEVICE int c_col(int n0, int e, int lane) { return n0 + 2 * (lane & 3) + (e & 1); }

// The workspace records (module comment): floats per (chunk, value head), per (chunk, key head).
BW24_DEVICE long long rec_floats(int DVP) { return 64LL * (DKP + DVP + GDN_CHUNK + 2); }
#define QK_REC (2 * 64 * DKP)

// ============================================================================ per chunk: W, U~, M
extern "C" __global__ void __launch_bounds__(CH_THREADS)
deltanet_chunk_prep(const float* __restrict__ qkv, int ldq, const float* __restrict__ bproj, int ldb,
                    const float* __restrict__ aproj, int lda, const float* __restrict__ A_,
                    const float* __restrict__ dt_bias, int T, int Hk, int Hv, int DV, int tiled, float scale,
                    float* __restrict__ ws, float* __restrict__ qkws) {
    extern __shared__ __align__(16) float psm[];
    float* Ks = psm;                 // [64][LDK] normalized k
    float* Qs = Ks + 64 * LDK;       // [64][LDK] normalized, scaled q; after the products: T [64][LDM], X
    float* Ts = Qs;
    float* Xs = Qs + 64 * LDM;       // up to 3 blocks of 16 x 16
    float* As = Qs + PREP_QT;        // [64][LDM] A; after the inverse: v pieces [64][LDV]
    float* Vs = As;
    float* bet = As + 64 * LDM;      // [64] each
    float* gam = bet + 64;
    float* eqs = gam + 64;
    float* eks = eqs + 64;
    float* sks = eks + 64;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, tid = threadIdx.x;
    const int c = blockIdx.x, h = blockIdx.y, t0 = c * GDN_CHUNK, nt = min(GDN_CHUNK, T - t0);
    const int kh = tiled ? h % Hk : h / (Hv / Hk);
    const bool writes_qk = tiled ? h < Hk : h % (Hv / Hk) == 0;  // one value head per key head
    const int DVP = (DV + 31) / 32 * 32;
    float* Rw = ws + ((long long)c * Hv + h) * rec_floats(DVP);
    float* Ru = Rw + 64 * DKP;
    float* Rm = Ru + 64 * DVP;
    float* Rg = Rm + 64 * GDN_CHUNK;  // exp(gam) | exp(gam_last - gam)
    float* Rqk = qkws + ((long long)c * Hk + kh) * QK_REC;
    pdl_trigger();
    const float A = A_[h], dtb = dt_bias[h];
    pdl_wait();  // q | k | v from the conv, b and a from their projections

    // rows: q, k normalized (one warp a row), beta and g; zeros past T
    for (int r = wp; r < GDN_CHUNK; r += CH_WARPS) {
        if (r < nt) {
            const long long t = t0 + r;
            const float* row = qkv + t * ldq;
            l2norm_row(row + kh * DK, Qs + r * LDK, scale, lane);
            l2norm_row(row + (Hk + kh) * DK, Ks + r * LDK, 1.0f, lane);
            if (lane == 0) {
                bet[r] = sigmoid(bproj[t * ldb + h]);
                gam[r] = gdn_log_decay(aproj[t * lda + h], dtb, A);
            }
        } else {
            for (int i = lane; i < DKP; i += 32) Qs[r * LDK + i] = 0.0f, Ks[r * LDK + i] = 0.0f;
            if (lane == 0) bet[r] = 0.0f, gam[r] = 0.0f;
        }
    }
    __syncthreads();
    // gam: the inclusive prefix sum of g (a Hillis-Steele scan of each half, then the first half's
    // total) in float64: a strong decay (g ~ -30 a row) takes gam to ~-2000, where float32's ulp
    // (1e-4) would be the relative error of every exp(gam_t - gam_s)
    __shared__ double gamd[GDN_CHUNK];
    if (wp == 0) {
        double x0 = gam[lane], x1 = gam[lane + 32];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y0 = __shfl_up_sync(0xffffffffu, x0, o), y1 = __shfl_up_sync(0xffffffffu, x1, o);
            if (lane >= o) x0 = __dadd_rn(x0, y0), x1 = __dadd_rn(x1, y1);
        }
        x1 = __dadd_rn(x1, __shfl_sync(0xffffffffu, x0, 31));
        gamd[lane] = x0, gamd[lane + 32] = x1;
    }
    if (writes_qk) {  // the normalized q | k of (chunk, kh)
        for (int e = tid; e < 64 * DKP / 4; e += CH_THREADS) {
            const int r = e / (DKP / 4), i = 4 * (e % (DKP / 4));
            *reinterpret_cast<float4*>(Rqk + r * DKP + i) = *reinterpret_cast<const float4*>(Qs + r * LDK + i);
            *reinterpret_cast<float4*>(Rqk + 64 * DKP + r * DKP + i) = *reinterpret_cast<const float4*>(Ks + r * LDK + i);
        }
    }
    __syncthreads();
    if (tid < GDN_CHUNK) {  // rows past T have g = 0: gam[63] is the last row's
        const float eq = expf((float)gamd[tid]), ek = expf((float)__dsub_rn(gamd[GDN_CHUNK - 1], gamd[tid]));
        eqs[tid] = eq, eks[tid] = ek, sks[tid] = __fmul_rn(bet[tid], eq);
        Rg[tid] = eq, Rg[GDN_CHUNK + tid] = ek;
    }

    // K K^T -> A (strictly lower, scaled), Q K^T -> M (lower, scaled): the tiles (row block I, n-tile
    // nb <= 2I + 1), 20 of them, five a warp
    for (int q = wp; q < 20; q += CH_WARPS) {
        int I = 0;
        while ((I + 1) * (I + 2) <= q) ++I;
        const int r0 = 16 * I, n0 = 8 * (q - I * (I + 1));
        float cg[4] = {0.f, 0.f, 0.f, 0.f}, cq[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k0 = 0; k0 < DKP; k0 += 8) {
            const FragB fb = frag_b([&](int k, int n) { return Ks[n * LDK + k]; }, k0, n0, lane);
            mma3(cg, frag_a([&](int r, int k) { return Ks[r * LDK + k]; }, r0, k0, lane), fb);
            mma3(cq, frag_a([&](int r, int k) { return Qs[r * LDK + k]; }, r0, k0, lane), fb);
        }
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = c_row(r0, e, lane), s = c_col(n0, e, lane);
            const float d = s <= r ? expf((float)__dsub_rn(gamd[r], gamd[s])) : 0.0f;
            As[r * LDM + s] = s < r ? __fmul_rn(__fmul_rn(bet[r], d), cg[e]) : 0.0f;
            Rm[r * GDN_CHUNK + s] = __fmul_rn(d, cq[e]);
        }
    }
    for (int e = tid; e < GDN_CHUNK * GDN_CHUNK; e += CH_THREADS) {  // M above the diagonal blocks
        const int r = e / GDN_CHUNK, s = e % GDN_CHUNK;
        if (s >= 16 * (r / 16 + 1)) Rm[e] = 0.0f;
    }
    __syncthreads();  // A complete; Q no longer needed (T and X take its place)

    // T = (I + A)^-1, unit lower triangular.  Diagonal blocks: warp w inverts block w by forward
    // substitution, lane m < 16 owning column m: T[i][m] = -(A[i][m] + sum_{j=m+1}^{i-1} A[i][j] T[j][m]).
    if (lane < 16) {
        const int b = 16 * wp, m = lane;
        for (int i = 0; i < 16; ++i) {
            float v = i == m ? 1.0f : 0.0f;
            if (i > m) {
                float acc = As[(b + i) * LDM + b + m];
                for (int j = m + 1; j < i; ++j) acc = fmaf(As[(b + i) * LDM + b + j], Ts[(b + j) * LDM + b + m], acc);
                v = -acc;
            }
            Ts[(b + i) * LDM + b + m] = v;
        }
    }
    __syncthreads();
    // Off-diagonal blocks, one block-diagonal d at a time: X_IJ = sum_{K=J}^{I-1} A_IK T_KJ, T_IJ = -T_II X_IJ (I = J + d).
    for (int d = 1; d < 4; ++d) {
        const int nb = 4 - d;
        for (int e = tid; e < nb * 256; e += CH_THREADS) {
            const int J = e >> 8, r = (e >> 4) & 15, col = e & 15, I = J + d;
            float acc = 0.0f;
            for (int k = 16 * J; k < 16 * I; ++k) acc = fmaf(As[(16 * I + r) * LDM + k], Ts[k * LDM + 16 * J + col], acc);
            Xs[e] = acc;
        }
        __syncthreads();
        for (int e = tid; e < nb * 256; e += CH_THREADS) {
            const int J = e >> 8, r = (e >> 4) & 15, col = e & 15, I = J + d;
            float acc = 0.0f;
            for (int k = 0; k <= r; ++k) acc = fmaf(Ts[(16 * I + r) * LDM + 16 * I + k], Xs[(J << 8) + k * 16 + col], acc);
            Ts[(16 * I + r) * LDM + 16 * J + col] = -acc;
        }
        __syncthreads();
    }

    // W = T diag(beta e^gam) K (64 x DKP): warp w the n-tiles w, w + 4, ...; row block I needs k < 16 (I + 1)
    for (int I = 0; I < 4; ++I) {
        float acc[NTW][4];
#pragma unroll
        for (int j = 0; j < NTW; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        for (int k0 = 0; k0 < 16 * (I + 1); k0 += 8) {
            const FragA fa = frag_a([&](int r, int k) { return Ts[r * LDM + k]; }, 16 * I, k0, lane);
#pragma unroll
            for (int j = 0; j < NTW; ++j)
                mma3(acc[j], fa, frag_b([&](int k, int n) { return __fmul_rn(sks[k], Ks[k * LDK + n]); }, k0, 8 * (wp + 4 * j), lane));
        }
#pragma unroll
        for (int j = 0; j < NTW; ++j) {
            const int r = c_row(16 * I, 0, lane), n = c_col(8 * (wp + 4 * j), 0, lane);
            *reinterpret_cast<float2*>(Rw + r * DKP + n) = make_float2(acc[j][0], acc[j][1]);
            *reinterpret_cast<float2*>(Rw + (r + 8) * DKP + n) = make_float2(acc[j][2], acc[j][3]);
        }
    }
    // U~ = T diag(beta) V (64 x DVP), v in pieces of 32 columns (zeros past DV and T): warp w its n-tile
    for (int p0 = 0; p0 < DVP; p0 += 32) {
        __syncthreads();  // A (first piece) / the previous piece no longer read
        for (int e = tid; e < 64 * 32; e += CH_THREADS) {
            const int r = e >> 5, j = e & 31;
            Vs[r * LDV + j] = r < nt && p0 + j < DV ? qkv[(long long)(t0 + r) * ldq + 2 * Hk * DK + h * DV + p0 + j] : 0.0f;
        }
        __syncthreads();
        for (int I = 0; I < 4; ++I) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            for (int k0 = 0; k0 < 16 * (I + 1); k0 += 8)
                mma3(acc, frag_a([&](int r, int k) { return Ts[r * LDM + k]; }, 16 * I, k0, lane),
                     frag_b([&](int k, int n) { return __fmul_rn(bet[k], Vs[k * LDV + n]); }, k0, 8 * wp, lane));
            const int r = c_row(16 * I, 0, lane), n = p0 + c_col(8 * wp, 0, lane);
            *reinterpret_cast<float2*>(Ru + r * DVP + n) = make_float2(acc[0], acc[1]);
            *reinterpret_cast<float2*>(Ru + (r + 8) * DVP + n) = make_float2(acc[2], acc[3]);
        }
    }
}

// ============================================================================ the state pass and the output
// rows x cols floats (cols a multiple of 4) global -> shared by cp.async, 16 bytes a copy
BW24_DEVICE void stage_rows(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
    const int per = cols / 4;
    for (int e = threadIdx.x; e < rows * per; e += CH_THREADS) {
        const int r = e / per, c4 = 4 * (e % per);
        cp_async16(dst + r * ldd + c4, src + (long long)r * lds + c4, 16);
    }
}

// (at least 2 blocks an SM: up to 255 registers; the state tiles, the Q S tile and one phase's fragments)
extern "C" __global__ void __launch_bounds__(CH_THREADS, 2)
deltanet_chunk_state(const float* __restrict__ ws, const float* __restrict__ qkws, float* __restrict__ S,
                     float* __restrict__ o, int ldo, int T, int Hk, int Hv, int DV, int tiled) {
    extern __shared__ __align__(16) float ssm[];
    float* slots = ssm;                    // 2 x ST_SLOT
    float* Us = ssm + 2 * ST_SLOT;         // [64][LDU] this chunk's U (the tile's columns)
    float* Ss = Us + 64 * LDU;             // [CH_BV][LDK] the state tile, column j's DK values contiguous
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int h = blockIdx.y, c0 = blockIdx.x * CH_BV;
    const int kh = tiled ? h % Hk : h / (Hv / Hk);
    const int DVP = (DV + 31) / 32 * 32, nch = (T + GDN_CHUNK - 1) / GDN_CHUNK;
    const long long rec = rec_floats(DVP);
    pdl_trigger();
    pdl_wait();  // the records from deltanet_chunk_prep, S from an earlier pass

    // phase p = 4 chunk + part into slot p % 2: W | U~ tile, Q | gates, M, K | gates
    auto stage = [&](int p) {
        float* sl = slots + (p & 1) * ST_SLOT;
        const float* R = ws + ((long long)(p >> 2) * Hv + h) * rec;
        const float* QK = qkws + ((long long)(p >> 2) * Hk + kh) * QK_REC;
        switch (p & 3) {
            case 0:
                stage_rows(sl, LDK, R, DKP, 64, DKP);
                stage_rows(sl + ST_MAIN, LDU, R + 64 * DKP + c0, DVP, 64, CH_BV);
                break;
            case 1:
                stage_rows(sl, LDK, QK, DKP, 64, DKP);
                stage_rows(sl + ST_MAIN + 64 * LDU, 128, R + 64 * (DKP + DVP + GDN_CHUNK), 128, 1, 128);
                break;
            case 2: stage_rows(sl, LDM, R + 64 * (DKP + DVP), GDN_CHUNK, 64, GDN_CHUNK); break;
            default:
                stage_rows(sl, LDK, QK + 64 * DKP, DKP, 64, DKP);
                stage_rows(sl + ST_MAIN + 64 * LDU, 128, R + 64 * (DKP + DVP + GDN_CHUNK), 128, 1, 128);
        }
        cp_async_commit();
    };
    // the next phase's slot, once staged and once every warp is done with the phase before (whose
    // slot the phase after is then staged into, overlapping this phase's work)
    auto next = [&](int p) -> const float* {
        cp_async_wait<0>();
        __syncthreads();
        if (p + 1 < 4 * nch) stage(p + 1);
        return slots + (p & 1) * ST_SLOT;
    };

    stage(0);
    for (int e = threadIdx.x; e < CH_BV * DKP; e += CH_THREADS) {
        const int j = e / DKP, i = e % DKP;
        Ss[j * LDK + i] = c0 + j < DV && i < DK ? S[((long long)h * DV + c0 + j) * DK + i] : 0.0f;
    }
    __syncthreads();
    float sr[MTW][NTB][4];  // this warp's 16-row tiles of S (rows 16 (wp + 4u) of DK)
#pragma unroll
    for (int u = 0; u < MTW; ++u)
#pragma unroll
        for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                sr[u][nb][e] = wp + CH_WARPS * u < MT ? Ss[c_col(8 * nb, e, lane) * LDK + c_row(16 * (wp + CH_WARPS * u), e, lane)] : 0.0f;

    const int r0 = 16 * wp;  // this warp's rows of the chunk
    auto s_b = [&](int k, int n) { return Ss[n * LDK + k]; };  // S (DK x CH_BV) as the B operand
    auto u_b = [&](int k, int n) { return Us[k * LDU + n]; };
    float qs[NTB][4];
    for (int ch = 0; ch < nch; ++ch) {
        // W: U = U~ - W S
        const float* sl = next(4 * ch);
        {
            float acc[NTB][4] = {};
            for (int k0 = 0; k0 < DKP; k0 += 8) {
                const FragA fa = frag_a([&](int r, int k) { return sl[r * LDK + k]; }, r0, k0, lane);
#pragma unroll
                for (int nb = 0; nb < NTB; ++nb) mma3(acc[nb], fa, frag_b(s_b, k0, 8 * nb, lane));
            }
#pragma unroll
            for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = c_row(r0, e, lane), n = c_col(8 * nb, e, lane);
                    Us[r * LDU + n] = __fsub_rn(sl[ST_MAIN + r * LDU + n], acc[nb][e]);
                }
        }
        // Q: qs = diag(e^gam) Q S
        sl = next(4 * ch + 1);
        {
#pragma unroll
            for (int nb = 0; nb < NTB; ++nb) qs[nb][0] = qs[nb][1] = qs[nb][2] = qs[nb][3] = 0.0f;
            for (int k0 = 0; k0 < DKP; k0 += 8) {
                const FragA fa = frag_a([&](int r, int k) { return sl[r * LDK + k]; }, r0, k0, lane);
#pragma unroll
                for (int nb = 0; nb < NTB; ++nb) mma3(qs[nb], fa, frag_b(s_b, k0, 8 * nb, lane));
            }
            const float* eq = sl + ST_MAIN + 64 * LDU;
#pragma unroll
            for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) qs[nb][e] = __fmul_rn(eq[c_row(r0, e, lane)], qs[nb][e]);
        }
        // M: O = qs + M U (M lower triangular: this warp's rows need U's rows < r0 + 16)
        sl = next(4 * ch + 2);
        {
            for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
                const FragA fa = frag_a([&](int r, int k) { return sl[r * LDM + k]; }, r0, k0, lane);
#pragma unroll
                for (int nb = 0; nb < NTB; ++nb) mma3(qs[nb], fa, frag_b(u_b, k0, 8 * nb, lane));
            }
#pragma unroll
            for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int t = ch * GDN_CHUNK + c_row(r0, e, lane), j = c0 + c_col(8 * nb, e, lane);
                    if (t < T && j < DV) o[(long long)t * ldo + (long long)h * DV + j] = qs[nb][e];
                }
        }
        // K: S = e^gam_last S + K^T diag(e^(gam_last - gam)) U, then S's shared copy for the next chunk
        // (its readers, this chunk's W and Q phases, passed this phase's barrier)
        sl = next(4 * ch + 3);
        {
            const float* eq = sl + ST_MAIN + 64 * LDU;
            const float* ek = eq + GDN_CHUNK;
            const float dec = eq[GDN_CHUNK - 1];
#pragma unroll
            for (int u = 0; u < MTW; ++u) {
                const int mt = wp + CH_WARPS * u;
                if (mt >= MT) break;
#pragma unroll
                for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sr[u][nb][e] = __fmul_rn(dec, sr[u][nb][e]);
                for (int k0 = 0; k0 < GDN_CHUNK; k0 += 8) {
                    const FragA fa = frag_a([&](int r, int k) { return __fmul_rn(sl[k * LDK + r], ek[k]); }, 16 * mt, k0, lane);
#pragma unroll
                    for (int nb = 0; nb < NTB; ++nb) mma3(sr[u][nb], fa, frag_b(u_b, k0, 8 * nb, lane));
                }
#pragma unroll
                for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) Ss[c_col(8 * nb, e, lane) * LDK + c_row(16 * mt, e, lane)] = sr[u][nb][e];
            }
        }
    }
#pragma unroll
    for (int u = 0; u < MTW; ++u) {
        const int mt = wp + CH_WARPS * u;
        if (mt >= MT) break;
#pragma unroll
        for (int nb = 0; nb < NTB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = c_row(16 * mt, e, lane), j = c0 + c_col(8 * nb, e, lane);
                if (i < DK && j < DV) S[((long long)h * DV + j) * DK + i] = sr[u][nb][e];
            }
    }
}
