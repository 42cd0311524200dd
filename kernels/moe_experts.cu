// moe_experts.cu — the routed experts of a decode step (m = 1..8 rows), on the resident dense
// layouts of one format (formats.cuh), and the prefill's combine.
//
// Contract (ops.Ops.experts; NumPy reference NumpyOps.experts)
//   Expert storage: per projection a device table tab u64 [E, 5] = the plane pointers {q, h, s,
//   d, gscale} of expert e (0 where the format has no such plane), each the dense resident layout
//   of cuda_weights.repack_host for one expert (gate|up interleaved: rows 2i = gate_i, 2i+1 =
//   up_i).  The kernels read only the table, so a later VRAM / host tier that moves an expert's
//   planes rewrites its row of the table and nothing else (cuda_moe.ExpertStore).
//   moe_gu(tab, x, normw, ids, act, D, F, k, kper, pro, xb16, eps): for row t = blockIdx.y and
//     slot j in [kper * blockIdx.z, +kper): e = ids[t, j], y = gu_e @ xin[t] (2F rows),
//     act[t, j, i] = swiglu_act(y[2i], y[2i+1]) (common.cuh).  pro 1: xin = (x * inv) * normw,
//     inv = rms_inv(sum of x^2 in the block's fixed order) (the deferred rmsnorm); 0: xin = x.
//   moe_down(tab, act, ids, w, shared, res, D, F, k, xb16): for row t = blockIdx.y and output o:
//     y_j = down_{ids[t,j]}[o] . act[t, j];  acc = w_0 * y_0;  acc = acc + w_j * y_j, j = 1..k-1
//     (each product rounded: __fmul_rn, no FMA);  acc = acc + shared[t, o] (if shared);
//     res[t, o] = res[t, o] + acc  (in place: the residual stream).
//   moe_combine(Y, w, shared, res, T, D, k, pos): the prefill's combine, the same order as
//     moe_down, of y_j = Y[pos[t k + j]] (Y [T k, D]: the grouped GEMMs' rows, moe_group.cu; pos
//     null: row t k + j).
//   The activations of every product: xin rounded to bf16 first with xb16 (the bf16-activation
//   contract), then, for the integer-dot formats (ACT_Q8 = kernel_refs.act_q8), quantized per 32
//   inputs by common.cuh act_quant_lane into their exact f32 values 2^e (h + l/256) —
//   kernel_refs.act_quant_ref, what NumpyOps.linear computes for an ActQuantMatrix.  The dot is
//   then the exact decoded weights (formats.cuh decode_exact) times those values in f32 (not yet
//   the dense matvec's dp4a integer dot: the same numbers up to f32 rounding; a faster dot is a
//   later change), times the per-row global scale (NVFP4) on the finished sum.
// Exactness: one warp owns an output (row pair for gu); lane L takes chunks L, L+32, ... in order,
//   __fmaf_rn per value, then warp_sum; staging and the rmsnorm statistic depend on the block
//   only.  Nothing depends on m, so row t of an m-row step equals the one-row step bit for bit
//   (speculative verify = plain decode), graph or eager.
// Layout: xin staged in shared memory swizzled as matvec.cu's (value e of the chunk lane L reads
//   in warp-tile w at w*WT + (e/4)*128 + 4L + e%4, WT = 32*VPC): each float4 read of a warp is 512
//   contiguous bytes.
//
// Napkin math (Qwen3-30B-A3B: D 2048, F 768, k 8 of E 128, 48 layers; batch 1):
//   weights read per token and layer = k (gu 2F*D + down D*F) = 8 x 3 x 2048 x 768 = 37.7 M
//   values: BF16 75.5 MB, Q8_0 (34/32 B) 40.1 MB, NVFP4 (9/16 B) 21.2 MB; 48 layers: BF16 3.62 GB,
//   Q8_0 1.93 GB, NVFP4 1.02 GB per token, plus the F32 router 1 MB a layer (48 MB).
//   Roofline of the experts alone at 3.0 / 4.2 TB/s (H100 / H200): BF16 829 / 1160 tok/s
//   (25.2 / 18.0 us a layer), Q8_0 1560 / 2180 (13.4 / 9.5 us), NVFP4 2940 / 4120 (7.1 / 5.0 us).
//   x staging: gu stages D floats per block (8 KB, L2), down k*F floats (24 KB) per block of 16
//   rows: 3 MB of L2 reads per token and layer (1.3x the Q8_0 down weights' 12.6 MB... from L2,
//   not HBM).  Grid: gu ceil(F / NW) x m x (k / kper) blocks (cuda_moe.gu_split picks kper so
//   that m = 1 fills the GPU), down ceil(D / (NW*R)) x m.
#include "common.cuh"
#include "formats.cuh"

#ifndef ACT_Q8
#define ACT_Q8 0
#endif
#if ACT_Q8 && IS_FLOAT_FMT
#error "ACT_Q8 is the integer-dot contract of the quantized formats"
#endif
#ifndef MOE_NW  // warps per block
#define MOE_NW 4
#endif
#ifndef MOE_R  // output rows per warp of moe_down
#define MOE_R 2
#endif
#define MOE_NT (MOE_NW * 32)
#define WT (32 * VPC)

// swizzled shared position of natural input i (i % 4 == 0: the float4 of inputs i..i+3)
BW24_DEVICE int swz(int i) {
    const int kc = i / VPC, e = i % VPC;
    return (kc >> 5) * WT + (e >> 2) * 128 + 4 * (kc & 31) + (e & 3);
}

BW24_DEVICE int padded(int n) { return (n + WT - 1) / WT * WT; }

// xin of n inputs (segments of seg inputs, each staged at a multiple of padded(seg)) into xs:
// scaled by inv * normw (pro 1), rounded to bf16 (xb16), quantized per 32 (ACT_Q8).  Whole
// warps run it (act_quant_lane's shuffles); n, seg multiples of 32 with ACT_Q8, of 4 without.
BW24_DEVICE void stage(float* xs, const float* __restrict__ x, int n, int seg, int pro, float inv,
                       const float* __restrict__ normw, int xb16) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sp = padded(seg);
    for (int base = warp * 128; base < n; base += MOE_NW * 128) {
        const int i = base + 4 * lane;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n) {
            v = *reinterpret_cast<const float4*>(x + i);
            if (pro == 1) {
                const float4 g = *reinterpret_cast<const float4*>(normw + i);
                v = make_float4(__fmul_rn(__fmul_rn(v.x, inv), g.x), __fmul_rn(__fmul_rn(v.y, inv), g.y),
                                __fmul_rn(__fmul_rn(v.z, inv), g.z), __fmul_rn(__fmul_rn(v.w, inv), g.w));
            }
            if (xb16) v = bf16_round4(v);
        }
#if ACT_Q8
        int e, sh, sl;
        uint32_t ql;
        const uint32_t qh = act_quant_lane(v, e, ql, sh, sl);
        const float s1 = pow2f(e), s2 = pow2f(e - 8);
        float q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[j] = __fadd_rn(__fmul_rn((float)(int)(int8_t)byte_of(qh, j), s1), __fmul_rn((float)(int)(int8_t)byte_of(ql, j), s2));
        v = make_float4(q[0], q[1], q[2], q[3]);
#endif
        if (i < n) {
            const int sg = i / seg;
            *reinterpret_cast<float4*>(xs + sg * sp + swz(i - sg * seg)) = v;
        }
    }
}

// the sums over the staged x of R rows (planes rp[r]) of nck chunks, every lane holding them
template <int R>
BW24_DEVICE void rows_dot(const RowPlanes (&rp)[R], const float* xs, int nck, float (&acc)[R]) {
    const int L = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    Raw cur[R];
    if (L < nck) {
#pragma unroll
        for (int r = 0; r < R; ++r) fetch_chunk_at(cur[r], rp[r], L);
    }
    for (int kc = L; kc < nck; kc += 32) {
        Raw nxt[R];
        if (kc + 32 < nck) {  // the next chunk's loads in flight while this one is used
#pragma unroll
            for (int r = 0; r < R; ++r) fetch_chunk_at(nxt[r], rp[r], kc + 32);
        }
        const float* xw = xs + (kc >> 5) * WT + 4 * L;
        float xv[VPC];
#pragma unroll
        for (int g = 0; g < VPC / 4; ++g) {
            const float4 f = *reinterpret_cast<const float4*>(xw + g * 128);
            xv[4 * g] = f.x;
            xv[4 * g + 1] = f.y;
            xv[4 * g + 2] = f.z;
            xv[4 * g + 3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float v[VPC];
            decode_exact(cur[r], kc, v);
#pragma unroll
            for (int e = 0; e < VPC; ++e) acc[r] = __fmaf_rn(v[e], xv[e], acc[r]);
        }
        if (kc + 32 < nck) {
#pragma unroll
            for (int r = 0; r < R; ++r) cur[r] = nxt[r];
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

BW24_DEVICE RowPlanes expert_row(const unsigned long long* __restrict__ tab, int e, long row, int nck) {
    const unsigned long long* te = tab + 5 * (long)e;
    return row_planes((const uint4*)te[0], (const void*)te[1], (const void*)te[2], (const void*)te[3], row, nck);
}

BW24_DEVICE float row_gscale(const unsigned long long* __restrict__ tab, int e, long row) {
#if FMT == F_NVFP4
    return __ldg((const float*)tab[5 * (long)e + 4] + row);
#else
    (void)tab; (void)e; (void)row;
    return 1.0f;
#endif
}

BW24_DEVICE float finish(float sum, float gs) {
#if FMT == F_NVFP4
    return __fmul_rn(sum, gs);
#else
    (void)gs;
    return sum;
#endif
}

extern "C" __global__ void __launch_bounds__(MOE_NT) moe_gu(const unsigned long long* __restrict__ tab, const float* __restrict__ x,
                                                            const float* __restrict__ normw, const int* __restrict__ ids,
                                                            float* __restrict__ act, int D, int F, int k, int kper, int pro,
                                                            int xb16, float eps) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    float* red = xs + padded(D);
    const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* xt = x + (long)t * D;
    PDL_ENTRY();
    float inv = 1.0f;
    if (pro == 1) {  // the rmsnorm statistic: per thread in order, warp_sum, then the warps in order
        float ss = 0.0f;
        for (int i = 4 * threadIdx.x; i < D; i += 4 * MOE_NT) {
            const float4 v = *reinterpret_cast<const float4*>(xt + i);
            ss = __fadd_rn(ss, __fmul_rn(v.x, v.x));
            ss = __fadd_rn(ss, __fmul_rn(v.y, v.y));
            ss = __fadd_rn(ss, __fmul_rn(v.z, v.z));
            ss = __fadd_rn(ss, __fmul_rn(v.w, v.w));
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        float tot = red[0];
        for (int w = 1; w < MOE_NW; ++w) tot = __fadd_rn(tot, red[w]);
        inv = rms_inv(tot, D, eps);
    }
    stage(xs, xt, D, D, pro, inv, normw, xb16);
    __syncthreads();
    const int i = blockIdx.x * MOE_NW + warp;  // the output pair (rows 2i, 2i+1)
    if (i >= F) return;
    const int nck = D / VPC;
    const int j0 = blockIdx.z * kper, j1 = min(k, j0 + kper);
    for (int j = j0; j < j1; ++j) {
        const int e = ids[(long)t * k + j];
        const RowPlanes rp[2] = {expert_row(tab, e, 2L * i, nck), expert_row(tab, e, 2L * i + 1, nck)};
        float acc[2];
        rows_dot<2>(rp, xs, nck, acc);
        if (lane == 0) {
            const float g = finish(acc[0], row_gscale(tab, e, 2L * i)), u = finish(acc[1], row_gscale(tab, e, 2L * i + 1));
            act[((long)t * k + j) * F + i] = swiglu_act(g, u);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_NT) moe_down(const unsigned long long* __restrict__ tab, const float* __restrict__ act,
                                                              const int* __restrict__ ids, const float* __restrict__ w,
                                                              const float* __restrict__ shared, float* __restrict__ res, int D,
                                                              int F, int k, int xb16) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    PDL_ENTRY();
    stage(xs, act + (long)t * k * F, k * F, F, 0, 1.0f, nullptr, xb16);
    __syncthreads();
    const int o0 = (blockIdx.x * MOE_NW + warp) * MOE_R;
    if (o0 >= D) return;
    const int nck = F / VPC, fp = padded(F);
    float acc[MOE_R];
    for (int j = 0; j < k; ++j) {
        const int e = ids[(long)t * k + j];
        const float wj = w[(long)t * k + j];
        RowPlanes rp[MOE_R];
#pragma unroll
        for (int r = 0; r < MOE_R; ++r) rp[r] = expert_row(tab, e, min(o0 + r, D - 1), nck);
        float y[MOE_R];
        rows_dot<MOE_R>(rp, xs + j * fp, nck, y);
#pragma unroll
        for (int r = 0; r < MOE_R; ++r) {
            const float p = __fmul_rn(wj, finish(y[r], row_gscale(tab, e, min(o0 + r, D - 1))));
            acc[r] = j == 0 ? p : __fadd_rn(acc[r], p);
        }
    }
#pragma unroll
    for (int r = 0; r < MOE_R; ++r) {
        const int o = o0 + r;
        if (lane == r && o < D) {
            float a = acc[r];
            if (shared) a = __fadd_rn(a, shared[(long)t * D + o]);
            res[(long)t * D + o] = __fadd_rn(res[(long)t * D + o], a);
        }
    }
}

extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ w, const float* __restrict__ shared,
                                       float* __restrict__ res, int T, int D, int k, const int* __restrict__ pos) {
    PDL_ENTRY();
    const int t = blockIdx.y, o = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T || o >= D) return;
    auto y = [&](int j) { const long a = (long)t * k + j; return Y[(pos ? (long)pos[a] : a) * D + o]; };
    float acc = __fmul_rn(w[(long)t * k], y(0));
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(w[(long)t * k + j], y(j)));
    if (shared) acc = __fadd_rn(acc, shared[(long)t * D + o]);
    res[(long)t * D + o] = __fadd_rn(res[(long)t * D + o], acc);
}
