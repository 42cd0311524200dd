// moe_router.cu — the expert choice of each row from its router logits (ops.RouterSpec).
//
// Contract
//   moe_router(logits, bias, ids, w, T, E, k, scoring, norm, n_group, topk_group, scale)
//     one block of NT threads (a multiple of 32, at most 1024: cuda_moe.router) per row t < T;
//     logits f32 [T, E] (the router matvec / GEMM wrote them), bias f32 [E] or null (the
//     selection bias, e_score_correction_bias);
//     writes ids int32 [T, k] and w f32 [T, k] in ranking order.
//   The rule is NumpyOps.router's, op for op (numpy_backend.route_logits, the NumPy mirror):
//     scoring 0 softmax: p = exp32(l - max) / S, S = the warp's sum (below);
//     scoring 1 sigmoid: p = 1 / (1 + exp32(-l));
//     s = p + bias (selection only);  n_group > 1 (DeepSeek-V3, arXiv:2412.19437 §2.1.2, and its
//     inference code: group score = the sum of the group's two largest s, the topk_group best
//     groups compete, the others are -inf);  ids = the k best s, ties to the lower index at every
//     step (group choice and expert choice);  w = p[ids];  norm: w /= (w_0 + w_1 + ... in
//     ranking order);  w *= scale (routed_scaling_factor).
//   exp32(v) = (float)exp((double)v): the correctly rounded f32 exponential (but for a 2^-29
//   chance per value), which NumPy reproduces (np.exp in float64, then rounded), so p has the
//   same bits on both sides; an f32 expf differs from NumPy's by an ulp now and then.
//   S: lane L adds the values of experts L, L+32, ... in order (from 0.0), then warp_sum's xor
//   butterfly (16, 8, 4, 2, 1) — route_logits mirrors that tree.
//   Limits: E <= 1024, k <= 32, n_group <= 32 with E % n_group == 0.
// Selection: "beats" (larger s, equal s the lower index) is a strict total order, so the expert
//   chosen at step j of the contract's k steps is the one that exactly j others beat: every
//   thread counts that rank for its experts over all E, and the k of rank < k write themselves
//   to place rank.  The groups' choice (n_group > 1) stays warp 0's, step by step.
//
// Napkin math: E = 128 logits per row: one warp taking the k experts in k steps of a 4-value scan
// and a 5-step shuffle argmax was ~3,700 dependent cycles of the ~6,000 a row took (4.7 us a
// launch on the H100, docs/performance.md); ranks are 128 independent compares per thread (4
// warps on the 4 schedulers, ~600 cycles), and the softmax's exponentials run one per thread.
// One launch per layer, beside the router matvec's 1 MB (F32 128 x 2048) read.  Graph-capturable:
// no host access; ids stay on the device for moe_experts.cu.
#include "common.cuh"

#define MOE_MAX_E 1024
#define NEG_INF __int_as_float(0xff800000)

BW24_DEVICE float exp32(float v) { return (float)exp((double)v); }

// (v, i) beats (v2, i2): larger value, equal values the lower index (i = INT_MAX: no candidate)
BW24_DEVICE bool beats(float v, int i, float v2, int i2) { return v > v2 || (v == v2 && i < i2); }

BW24_DEVICE void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (beats(v2, i2, v, i)) {
            v = v2;
            i = i2;
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024) moe_router(const float* __restrict__ logits, const float* __restrict__ bias,
                                                               int* __restrict__ ids, float* __restrict__ w, int T, int E, int k,
                                                               int scoring, int norm, int n_group, int topk_group, float scale) {
    PDL_ENTRY();
    __shared__ float p_s[MOE_MAX_E], s_s[MOE_MAX_E];
    __shared__ float w_s[32], red[32];
    const int t = blockIdx.x, tid = threadIdx.x, L = tid & 31, warp = tid >> 5, NT = blockDim.x;
    if (t >= T) return;
    const float* lg = logits + (long)t * E;
    if (scoring == 0) {
        float mx = NEG_INF;
        for (int e = tid; e < E; e += NT) mx = fmaxf(mx, lg[e]);
        mx = warp_max(mx);
        if (L == 0) red[warp] = mx;
        __syncthreads();
        mx = red[0];
        for (int i = 1; i < NT / 32; ++i) mx = fmaxf(mx, red[i]);
        for (int e = tid; e < E; e += NT) p_s[e] = exp32(__fsub_rn(lg[e], mx));
        __syncthreads();
        if (warp == 0) {  // S in the contract's order
            float acc = 0.0f;
            for (int e = L; e < E; e += 32) acc = __fadd_rn(acc, p_s[e]);
            acc = warp_sum(acc);
            if (L == 0) red[0] = acc;
        }
        __syncthreads();
        const float S = red[0];
        for (int e = tid; e < E; e += NT) p_s[e] = __fdiv_rn(p_s[e], S);
    } else {
        for (int e = tid; e < E; e += NT) p_s[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp32(-lg[e])));
    }
    for (int e = tid; e < E; e += NT) s_s[e] = bias ? __fadd_rn(p_s[e], bias[e]) : p_s[e];
    __syncthreads();
    if (n_group > 1 && warp == 0) {  // group-limited: lane g scores group g by its top-2 sum, topk_group groups stay
        const int gs = E / n_group;
        float score = NEG_INF;
        if (L < n_group) {
            float t1 = NEG_INF, t2 = NEG_INF;
            for (int e = L * gs; e < (L + 1) * gs; ++e) {
                const float v = s_s[e];
                if (v > t1) {
                    t2 = t1;
                    t1 = v;
                } else if (v > t2) {
                    t2 = v;
                }
            }
            score = __fadd_rn(t1, t2);
        }
        bool keep = false, taken = false;
        for (int r = 0; r < topk_group; ++r) {
            float v = score;
            int i = (L < n_group && !taken) ? L : 0x7fffffff;
            if (i == 0x7fffffff) v = NEG_INF;
            warp_best(v, i);
            if (i == L) taken = keep = true;
        }
        const unsigned kept = __ballot_sync(0xffffffffu, keep);
        __syncwarp();
        for (int e = L; e < E; e += 32)
            if (!((kept >> (e / gs)) & 1u)) s_s[e] = NEG_INF;
    }
    __syncthreads();
    for (int e = tid; e < E; e += NT) {  // the rank of expert e: how many beat it
        const float v = s_s[e];
        int rank = 0;
#pragma unroll 4
        for (int f = 0; f < E; ++f) rank += beats(s_s[f], f, v, e) ? 1 : 0;
        if (rank < k) {
            ids[(long)t * k + rank] = e;
            w_s[rank] = p_s[e];
        }
    }
    __syncthreads();
    if (tid == 0) {
        float total = w_s[0];
        for (int j = 1; j < k; ++j) total = __fadd_rn(total, w_s[j]);
        for (int j = 0; j < k; ++j) {
            const float v = norm ? __fdiv_rn(w_s[j], total) : w_s[j];
            w[(long)t * k + j] = __fmul_rn(v, scale);
        }
    }
}
