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
// Launch: 1-D grid-stride, 256 threads, one 16-byte chunk (VPC values) per thread-iteration;
// each thread writes its VPC contiguous floats as float4 stores.
#include "common.cuh"
#include "formats.cuh"

extern "C" __global__ void __launch_bounds__(256)
dequant_rows(const uint4* __restrict__ wq, const void* __restrict__ wh, const void* __restrict__ ws,
             const void* __restrict__ wd, const float* __restrict__ gscale, const int* __restrict__ ids,
             int n_rows, int n_in, float* __restrict__ out) {
    PDL_ENTRY();
    const int nck = n_in / VPC;
    const long total = (long)n_rows * nck;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long t = i / nck;
        const int kc = (int)(i - t * nck);
        const long row = ids ? (long)ids[t] : t;
        Raw r;
        fetch_chunk(r, wq, wh, ws, wd, row, nck, kc);
        float v[VPC];
        decode_exact(r, kc, v);
        if (gscale) {
            const float gs = gscale[row];
#pragma unroll
            for (int e = 0; e < VPC; ++e) v[e] = __fmul_rn(v[e], gs);
        }
        float4* o = reinterpret_cast<float4*>(out + t * n_in + (long)kc * VPC);
#pragma unroll
        for (int e = 0; e < VPC; e += 4) o[e >> 2] = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    }
}
