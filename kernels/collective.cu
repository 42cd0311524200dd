// collective.cu — each GPU's local half of the exchanges of a model split over several GPUs
// (--gpus, bw24chat/parallel.py; backends/cuda_sharded.py).  NCCL only moves bytes (an all-gather
// of every GPU's piece into one buffer [world][n] on each GPU); the arithmetic is here, in one
// fixed order, so every GPU computes the same bits and the pass is deterministic run to run.
//
// reduce_ranks(g, out, world, n, add): out[i] = (add ? out[i] + S : S), S = ((g[0][i] + g[1][i]) +
//   g[2][i]) + ..., each addition rounded to float32 (__fadd_rn): the all-reduce of partial sums
//   in rank order (numpy_sharded.reduce_ranks, then the residual added once, as the unsplit
//   matvec / GEMM "add" epilogue adds its one product).  With world = 1: out = out + g[0], the
//   single-GPU epilogue's bits.  g: float32 [world][n]; out: float32 [n] (the residual stream).
//   Napkin math: Qwen3-8B decode, one row: (world + 2) x 16 KB — under a microsecond at HBM
//   rate; the launch (~2 us in a graph) is the cost, not the bytes.
//   Launch: grid ceil(n / 256), block 256.
//
// vocab_gather(g, out, world, rows, vc, V, ldo): out[t * ldo + r * vc + j] = g[r * rows * vc + t * n_r + j]
//   for j < n_r = min(vc, V - r vc): the LM head's all-gathered logits put in vocabulary order.  GPU
//   r holds the vocabulary's rows [r vc, r vc + n_r), vc = ceil(V / world), and sends rows * vc
//   values (NCCL's equal counts) whose first rows * n_r are its logits [rows][n_r] (the rest is
//   never read); row t of the pass lands at its logits row.  A copy, bit-exact.  Napkin math: 2 x 4 B per logit (151,936 a row:
//   1.2 MB, ~0.5 us at HBM rate).  Launch: grid (ceil(world * vc / 256), rows), block 256.
#include "common.cuh"

extern "C" __global__ void reduce_ranks(const float* __restrict__ g, float* __restrict__ out, int world, long n,
                                        int add) {
    PDL_ENTRY();
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = g[i];
    for (int r = 1; r < world; ++r) s = __fadd_rn(s, g[(long)r * n + i]);
    out[i] = add ? __fadd_rn(out[i], s) : s;
}

extern "C" __global__ void vocab_gather(const float* __restrict__ g, float* __restrict__ out, int world, int rows,
                                        int vc, int V, long ldo) {
    PDL_ENTRY();
    const long c = (long)blockIdx.x * blockDim.x + threadIdx.x;  // vocabulary id r * vc + j
    const int t = blockIdx.y;
    if (c >= (long)world * vc || c >= V) return;
    const int r = (int)(c / vc), j = (int)(c - (long)r * vc);
    const int n_r = min(vc, V - r * vc);
    out[(long)t * ldo + c] = g[(long)r * rows * vc + (long)t * n_r + j];
}
