// elementwise.cu — small element-wise ops of the prefill path.
//
// swiglu_rows: act[t, j] = silu(gu[t, 2j]) * gu[t, 2j + 1] = g / (1 + exp(-g)) * u
//   gu: float32 [T, 2F], the fused gate/up GEMM output with the weight rows interleaved
//   (gate_0, up_0, gate_1, up_1, ...: cuda_weights.repack_host(interleave=True)); act: float32
//   [T, F].  Mirrors NumpyBackend.swiglu: g / (1 + exp(-g)) * up, each operation rounded on
//   its own (__fdiv_rn / __fadd_rn / __fmul_rn, IEEE expf) — the same function (swiglu_act in
//   common.cuh) as the decode matvec's swiglu epilogue, so prefill and decode compute the MLP
//   input identically from equal inputs.
//   Launch: grid (ceil(F / 256), T), block 256.
#include "common.cuh"

extern "C" __global__ void swiglu_rows(const float* __restrict__ gu, float* __restrict__ act, int T, int F) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (j >= F || t >= T) return;
    const float2 gu2 = reinterpret_cast<const float2*>(gu + (long long)t * 2 * F)[j];
    act[(long long)t * F + j] = swiglu_act(gu2.x, gu2.y);
}
