// dequant.cu — whole-tensor dequantization and embedding gather, bit-exact with
// bw24chat.quants.dequantize (times the NVFP4 global scale, as QTensor.dequantize does).
//
// Contract
//   dequant_rows(wq, wh, ws, wd, gscale, ids, n_rows, n_in, out)
//     out[t, :] = W[row(t), :] as float32, row(t) = ids[t] (int32) or t when ids == nullptr,
//     t = 0..n_rows-1; out is [n_rows, n_in] row-major.
//   W is a repacked matrix (kernels/formats.cuh, bw24chat/backends/cuda_weights.py), FMT one
//   format per compile; gscale is the per-row NVFP4 global scale (nullptr for other formats).
// Math: formats.cuh decode_exact (the float ops of quants.py / ggml-quants.c in their order, no
// FMA), then one rounded multiply by gscale[row] (QTensor.dequantize: out * float32(gs)).
//   dequant_bf16(wq, wh, ws, wd, row0, n_rows, n_in, hi, lo)
//     hi[t, :] = bf16(W[row0 + t, :]), lo[t, :] = bf16(W - hi) when lo != nullptr (the prefill
//     GEMM's weight planes, gemm.cu gemm_wgp; no global scale: the GEMM epilogue applies it).
// Launch: 1-D grid-stride, 256 threads, one 16-byte chunk (VPC values) per thread-iteration;
// each thread writes its VPC contiguous values as 16-byte stores (8-byte for F32 to bf16).
#include "common.cuh"
#include "formats.cuh"

// the grid-stride walk shared by both kernels: chunk kc of row row_of(t), t < n_rows, decoded to
// its exact values v[VPC] (formats.cuh decode_exact), handed to put(t, row, kc, v)
template <class RowOf, class Put>
BW24_DEVICE void for_each_chunk(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
                                const void* __restrict__ wd, int n_rows, int n_in, RowOf row_of, Put put) {
    const int nck = n_in / VPC;
    const long total = (long)n_rows * nck;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long t = i / nck;
        const int kc = (int)(i - t * nck);
        const long row = row_of(t);
        Raw r;
        fetch_chunk(r, wq, wh, ws, wd, row, nck, kc);
        float v[VPC];
        decode_exact(r, kc, v);
        put(t, row, kc, v);
    }
}

extern "C" __global__ void __launch_bounds__(256)
dequant_rows(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
             const void* __restrict__ wd, const float* __restrict__ gscale, const int* __restrict__ ids,
             int n_rows, int n_in, float* __restrict__ out) {
    PDL_ENTRY();
    for_each_chunk(wq, wh, ws, wd, n_rows, n_in, [&](long t) { return ids ? (long)ids[t] : t; },
                   [&](long t, long row, int kc, float (&v)[VPC]) {
        if (gscale) {
            const float gs = gscale[row];
#pragma unroll
            for (int e = 0; e < VPC; ++e) v[e] = __fmul_rn(v[e], gs);
        }
        float4* o = reinterpret_cast<float4*>(out + t * n_in + (long)kc * VPC);
#pragma unroll
        for (int e = 0; e < VPC; e += 4) o[e >> 2] = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    });
}

// dequant_bf16: rows [row0, row0 + n_rows) as bf16 planes for the prefill GEMM (gemm.cu
// gemm_wgp): hi[t, k] = bf16(W[row0 + t, k]) and, when lo != null, lo[t, k] = bf16(W - hi) — the
// values gemm.cu's TileStager stages (the NVFP4 global scale is left to the GEMM epilogue).
extern "C" __global__ void __launch_bounds__(256)
dequant_bf16(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
             const void* __restrict__ wd, long row0, int n_rows, int n_in, __nv_bfloat16* __restrict__ hi,
             __nv_bfloat16* __restrict__ lo) {
    PDL_ENTRY();
    for_each_chunk(wq, wh, ws, wd, n_rows, n_in, [&](long t) { return row0 + t; },
                   [&](long t, long row, int kc, float (&v)[VPC]) {
        (void)row;
        // 16-byte stores (8 values) where the chunk has them: F32 chunks hold 4 values
        constexpr int SV = VPC >= 8 ? 8 : 4;
#pragma unroll
        for (int e = 0; e < VPC; e += SV) {
            uint2 h[2], l[2];
#pragma unroll
            for (int p = 0; p < SV / 4; ++p) split_bf16x4(make_float4(v[e + 4 * p], v[e + 4 * p + 1], v[e + 4 * p + 2], v[e + 4 * p + 3]), h[p], l[p]);
            __nv_bfloat16* dh = hi + t * n_in + (long)kc * VPC + e;
            __nv_bfloat16* dl = lo + t * n_in + (long)kc * VPC + e;
            if (SV == 8) {
                *reinterpret_cast<uint4*>(dh) = make_uint4(h[0].x, h[0].y, h[1].x, h[1].y);
                if (lo) *reinterpret_cast<uint4*>(dl) = make_uint4(l[0].x, l[0].y, l[1].x, l[1].y);
            } else {
                *reinterpret_cast<uint2*>(dh) = h[0];
                if (lo) *reinterpret_cast<uint2*>(dl) = l[0];
            }
        }
    });
}
