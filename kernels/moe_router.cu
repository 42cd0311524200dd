// moe_router.cu — the expert choice of each row from its router logits (ops.RouterSpec).
//
// Contract
//   moe_router(logits, bias, ids, w, T, E, k, scoring, norm, n_group, topk_group, scale)
//     one warp (one block) per row t < T; logits f32 [T, E] (the router matvec / GEMM wrote
//     them), bias f32 [E] or null (the selection bias, e_score_correction_bias);
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
//   Limits: E <= 1024 (32 experts per lane), k <= 32, n_group <= 32 with E % n_group == 0.
//
// Napkin math: E = 128 logits per row: ~1 us of one warp per row (k rounds of a 4-value scan and
// a 5-step shuffle argmax); one launch per layer, beside the router matvec's 1 MB (F32 128 x 2048)
// read.  Graph-capturable: no host access; ids stay on the device for moe_experts.cu.
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

extern "C" __global__ void __launch_bounds__(32) moe_router(const float* __restrict__ logits, const float* __restrict__ bias,
                                                             int* __restrict__ ids, float* __restrict__ w, int T, int E, int k,
                                                             int scoring, int norm, int n_group, int topk_group, float scale) {
    PDL_ENTRY();
    __shared__ float p_s[MOE_MAX_E], s_s[MOE_MAX_E];
    __shared__ float w_s[32];
    const int t = blockIdx.x, L = threadIdx.x;
    if (t >= T) return;
    const float* lg = logits + (long)t * E;
    if (scoring == 0) {
        float mx = NEG_INF;
        for (int e = L; e < E; e += 32) mx = fmaxf(mx, lg[e]);
        mx = warp_max(mx);
        float acc = 0.0f;
        for (int e = L; e < E; e += 32) {
            const float ex = exp32(__fsub_rn(lg[e], mx));
            p_s[e] = ex;
            acc = __fadd_rn(acc, ex);
        }
        acc = warp_sum(acc);
        for (int e = L; e < E; e += 32) p_s[e] = __fdiv_rn(p_s[e], acc);
    } else {
        for (int e = L; e < E; e += 32) p_s[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp32(-lg[e])));
    }
    for (int e = L; e < E; e += 32) s_s[e] = bias ? __fadd_rn(p_s[e], bias[e]) : p_s[e];
    __syncwarp();
    if (n_group > 1) {  // group-limited: lane g scores group g by its top-2 sum, topk_group groups stay
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
        __syncwarp();
    }
    unsigned taken = 0u;  // bit q: expert L + 32 q already chosen
    for (int j = 0; j < k; ++j) {
        float v = NEG_INF;
        int i = 0x7fffffff;
        for (int e = L, q = 0; e < E; e += 32, ++q) {
            if ((taken >> q) & 1u) continue;
            if (beats(s_s[e], e, v, i)) {
                v = s_s[e];
                i = e;
            }
        }
        warp_best(v, i);
        if ((i & 31) == L) taken |= 1u << (i >> 5);
        if (L == 0) {
            ids[(long)t * k + j] = i;
            w_s[j] = p_s[i];
        }
    }
    if (L == 0) {
        float total = w_s[0];
        for (int j = 1; j < k; ++j) total = __fadd_rn(total, w_s[j]);
        for (int j = 0; j < k; ++j) {
            const float v = norm ? __fdiv_rn(w_s[j], total) : w_s[j];
            w[(long)t * k + j] = __fmul_rn(v, scale);
        }
    }
}
