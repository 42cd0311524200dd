// norm.cu — RMSNorm over rows (Zhang & Sennrich 2019), plain and fused with the residual add.
//
// Shape legend: T rows (tokens, or tokens*heads for a per-head norm), D row length.
//
// Contract (mirrors NumpyBackend.rmsnorm in bw24chat/backends/numpy_backend.py):
//   rmsnorm     : out[t] = (x[t] * (1 / sqrtf(sum(x[t]^2) / D + eps))) * w
//   add_rmsnorm : residual[t] += x[t] (written back, in place); out[t] = rmsnorm(residual[t]) * w
//                 (the pre-norm block's "x = x + f(x); h = norm(x)" in one pass, prefill path)
//   rmsnorm_concat : out[t] = [a'[t] | b'[t]], a' = rmsnorm(xa[t]) * wa (or xa[t] itself when wa is
//                 null), b' likewise (ops.concat of two deferred rmsnorms: the MTP head's
//                 [enorm(emb) | hnorm(h)], models/mtp.py); each half's values are the rmsnorm
//                 kernel's bit for bit where both halves take the same NT (the same reduction
//                 order over its own Da or Db values; the MTP head's halves are both D wide)
//   The products and the final scaling are single float32 roundings (__fmul_rn), as NumPy's;
//   only the sum of squares differs in order from NumPy's pairwise sum, so results agree to a
//   few ulp, not bit for bit.
//   Reduction order (fixed for a given D, independent of T, so decode and verify rows agree):
//     thread i owns float4 groups i, i+NT, i+2NT, ...; it sums their squares in that order,
//     each float4 as ((a^2 + b^2) + c^2) + d^2; then a 32-lane xor butterfly; then thread 0's
//     view: warp partials added in warp order 0..NT/32-1 (every thread does the same adds).
// Layout: x, residual, out float32 [T, D] row-major (row stride D), w float32 [D]; D % 4 == 0.
//   rmsnorm_concat: xa [T, Da], xb [T, Db], out [T, Da + Db] row-major; Da, Db % 4 == 0.
// Launch geometry: grid = T blocks (one row each), NT = 256 threads (D <= 8192) or 1024
//   (D <= 32768); the row stays in registers (VPT float4 per thread, fully unrolled).
//   rmsnorm_concat: grid (T, 2), block y = the half (NT, VPT sized for the wider half).
// Napkin math (the MTP head, D = 4096, m = 8 rows): 2 x 8 x 16 KB read, 256 KB written; a few
//   microseconds, one launch in place of two norms and a copy.
// Defines: NT (threads per block, default 256), VPT (float4 per thread, default 8).
#include "common.cuh"

#ifndef NT
#define NT 256
#endif
#ifndef VPT
#define VPT 8
#endif

// Sum over the block in the documented order; every thread gets the same value.
BW24_DEVICE float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NT / 32; ++i) s += red[i];
    return s;
}

BW24_DEVICE float sq4(float4 a) {
    return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(a.x, a.x), __fmul_rn(a.y, a.y)), __fmul_rn(a.z, a.z)), __fmul_rn(a.w, a.w));
}

BW24_DEVICE void norm_store(const float4 (&v)[VPT], float ss, int D, float eps, const float4* __restrict__ w,
                            float4* __restrict__ o) {
    const int D4 = D >> 2;
    const float inv = rms_inv(ss, D, eps);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = threadIdx.x + i * NT;
        if (j < D4) {
            const float4 g = w[j];
            float4 r;
            r.x = __fmul_rn(__fmul_rn(v[i].x, inv), g.x);
            r.y = __fmul_rn(__fmul_rn(v[i].y, inv), g.y);
            r.z = __fmul_rn(__fmul_rn(v[i].z, inv), g.z);
            r.w = __fmul_rn(__fmul_rn(v[i].w, inv), g.w);
            o[j] = r;
        }
    }
}

// This thread's values of a row (VPT float4s, zeros past D4) and the sum of their squares, in
// the order block_sum then completes (rmsnorm and rmsnorm_concat: the same bits per row).
BW24_DEVICE float load_row(float4 (&v)[VPT], const float4* __restrict__ xr, int D4) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = threadIdx.x + i * NT;
        v[i] = j < D4 ? xr[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        if (j < D4) ss = __fadd_rn(ss, sq4(v[i]));
    }
    return ss;
}

extern "C" __global__ void __launch_bounds__(NT)
rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float eps, int D, float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float red[NT / 32];
    const long long row = blockIdx.x;
    const float4* xr = (const float4*)(x + row * D);
    const int D4 = D >> 2;
    float4 v[VPT];
    float ss = load_row(v, xr, D4);
    ss = block_sum(ss, red);
    norm_store(v, ss, D, eps, (const float4*)w, (float4*)(out + row * D));
}

extern "C" __global__ void __launch_bounds__(NT)
add_rmsnorm(const float* __restrict__ x, float* __restrict__ residual, const float* __restrict__ w, float eps, int D,
            float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float red[NT / 32];
    const long long row = blockIdx.x;
    const float4* xr = (const float4*)(x + row * D);
    float4* rr = (float4*)(residual + row * D);
    const int D4 = D >> 2;
    float4 v[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = threadIdx.x + i * NT;
        if (j < D4) {
            const float4 a = xr[j], r = rr[j];
            v[i] = make_float4(__fadd_rn(r.x, a.x), __fadd_rn(r.y, a.y), __fadd_rn(r.z, a.z), __fadd_rn(r.w, a.w));
            rr[j] = v[i];
            ss = __fadd_rn(ss, sq4(v[i]));
        } else {
            v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    ss = block_sum(ss, red);
    norm_store(v, ss, D, eps, (const float4*)w, (float4*)(out + row * D));
}

extern "C" __global__ void __launch_bounds__(NT)
rmsnorm_concat(const float* __restrict__ xa, const float* __restrict__ wa, int Da, const float* __restrict__ xb,
               const float* __restrict__ wb, int Db, float eps, float* __restrict__ out) {
    PDL_ENTRY();
    __shared__ float red[NT / 32];
    const long long row = blockIdx.x;
    const bool second = blockIdx.y == 1;
    const int D = second ? Db : Da;
    const float* w = second ? wb : wa;
    const float4* xr = (const float4*)((second ? xb : xa) + row * D);
    float4* o = (float4*)(out + row * (Da + Db) + (second ? Da : 0));
    const int D4 = D >> 2;
    float4 v[VPT];
    float ss = load_row(v, xr, D4);
    if (w == nullptr) {  // a plain half: copied
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int j = threadIdx.x + i * NT;
            if (j < D4) o[j] = v[i];
        }
        return;
    }
    ss = block_sum(ss, red);
    norm_store(v, ss, D, eps, (const float4*)w, o);
}
