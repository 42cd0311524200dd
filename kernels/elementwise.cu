// elementwise.cu — small element-wise ops of the prefill path.
//
// swiglu_rows: act[t, j] = silu(gu[t, j]) * gu[t, F + j] = g / (1 + exp(-g)) * u
//   gu: float32 [T, 2F] (gate | up, the fused gate/up GEMM output), act: float32 [T, F].
//   Mirrors NumpyBackend.swiglu: g / (1 + exp(-g)) * up, each operation rounded on its own
//   (__fdiv_rn / __fadd_rn / __fmul_rn, IEEE expf), the same formula the matvec swiglu prologue
//   uses, so the prefill and decode paths compute the MLP input identically from equal inputs.
//   Launch: grid (ceil(F / 256), T), block 256.
#include "common.cuh"

extern "C" __global__ void swiglu_rows(const float* __restrict__ gu, float* __restrict__ act, int T, int F) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (j >= F || t >= T) return;
    const float g = gu[(long long)t * 2 * F + j];
    const float u = gu[(long long)t * 2 * F + F + j];
    act[(long long)t * F + j] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}
