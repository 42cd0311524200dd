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
//
// output_gate_rows: o[t, h HD + d] = o[t, h HD + d] * sigmoid(q[t, 2 h HD + HD + d]), in place: the
//   gated attention's output scaled by the gate half of its q projection (ops.output_gate; per
//   head [q | gate], transformers Qwen3NextAttention: attn_output * torch.sigmoid(gate)), each
//   operation rounded on its own as NumpyOps.output_gate (common.cuh sigmoid).  o: float32
//   [T, H HD] contiguous; q: the q projection's rows, ldq floats apart.
//   Launch: grid (ceil(H HD / 256), T), block 256.
//
// shared_gate_rows: s[t] = s[t] * sigmoid(dot(x[t], g)), in place: a shared expert's output scaled
//   by its gate (Qwen2-MoE / Qwen3-Next shared_expert_gate; ops.experts, NumpyOps.experts:
//   out * sigmoid(x @ gate)), x the layer's normed input.  The dot: thread i adds x[j] g[j] for
//   j = i, i + 256, ... in order (each product rounded), then common.cuh warp_sum, then the 8 warp
//   partials in order; every row alike, so prefill and decode rows agree.  s, x: float32 [T, D]
//   contiguous.  Launch: grid T, block 256.
//
// vocab_expand_rows: out[t, j] = vmap[j] >= 0 ? sub[t, vmap[j]] : -inf (ops.vocab_expand): a reduced
//   draft vocabulary's logits put back at their token ids (FR-Spec, Zhao et al. 2025), so the
//   sampler draws among those ids.  sub: float32 [T, n]; vmap: int32 [V] (the index of id j among
//   the n, -1 outside); out: float32 [T, V].  A gather, no arithmetic: bit-exact to
//   numpy_backend.vocab_expand_ref.  Napkin math: V = 151,936 reads 4 B of vmap + writes 4 B per id
//   (~1.2 MB, < 1 us at H100 bandwidth); the n-row LM head before it is what the reduced vocabulary
//   saves (V / n times fewer weight bytes).  Launch: grid (ceil(V / 256), T), block 256.
//
// put_columns_rows: dst[t, lo + j] = src[t, j] (add = 0) or dst[t, lo + j] + src[t, j] (add = 1, one
//   rounding, as a matvec / GEMM "add" epilogue): one format's share of a linear whose fused
//   tensors come in several formats (cuda_weights.PartedWeight: llama.cpp's Q4_K_M keeps attn_v
//   in Q6_K beside Q4_K q and k), put at its columns of the fused output.  src: float32 [T, n]
//   contiguous; dst: rows ldd floats apart.  A copy: 8 B a value (a Qwen3-8B v share of 1024
//   columns: 8 KB a row, well under a microsecond).  Launch: grid (ceil(n / 256), T), block 256.
#include "common.cuh"

extern "C" __global__ void swiglu_rows(const float* __restrict__ gu, float* __restrict__ act, int T, int F) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (j >= F || t >= T) return;
    const float2 gu2 = reinterpret_cast<const float2*>(gu + (long long)t * 2 * F)[j];
    act[(long long)t * F + j] = swiglu_act(gu2.x, gu2.y);
}

extern "C" __global__ void output_gate_rows(float* __restrict__ o, const float* __restrict__ q, int ldq, int T, int H, int hd) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (i >= H * hd || t >= T) return;
    const int h = i / hd;
    float* p = o + (long long)t * H * hd + i;
    *p = __fmul_rn(*p, sigmoid(q[(long long)t * ldq + (long long)h * 2 * hd + hd + (i - h * hd)]));
}

extern "C" __global__ void __launch_bounds__(256)
shared_gate_rows(float* __restrict__ s, const float* __restrict__ x, const float* __restrict__ g, int D) {
    PDL_ENTRY();
    __shared__ float part[8];
    const long long row = (long long)blockIdx.x * D;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < D; j += 256) acc = __fadd_rn(acc, __fmul_rn(x[row + j], g[j]));
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    float dot = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) dot = __fadd_rn(dot, part[w]);
    const float gate = sigmoid(dot);
    for (int j = threadIdx.x; j < D; j += 256) s[row + j] = __fmul_rn(s[row + j], gate);
}

extern "C" __global__ void vocab_expand_rows(const float* __restrict__ sub, const int* __restrict__ vmap,
                                             float* __restrict__ out, int n, int V) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (j >= V) return;
    const int i = vmap[j];
    out[(long long)t * V + j] = i >= 0 ? sub[(long long)t * n + i] : __int_as_float(0xff800000);  // -inf
}

extern "C" __global__ void put_columns_rows(const float* __restrict__ src, float* __restrict__ dst, int ldd, int n,
                                            int add) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (j >= n) return;
    const float v = src[(long long)t * n + j];
    float* d = dst + (long long)t * ldd + j;
    *d = add ? __fadd_rn(*d, v) : v;
}
