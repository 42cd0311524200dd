// sampling.cu — on-device token choice: argmax and the full sampler of bw24chat/sampling.py.
//
// Shape legend: V vocabulary, R ring capacity (recent ids).
//
// Contract: bw24chat/sampling.py (sample_token, philox_uniform, apply_repeat_penalty) — read it;
// steps 1..8 there, in that order.  How this kernel computes them:
//   order   : the reference sorts candidates by (scaled logit desc, id asc).  Here every element
//             gets the 64-bit key ((~asc(scaled)) << 32 | id), asc() the order-preserving map of
//             float bits (-0.0 folded to +0.0 so that 0.0 ties resolve by id as in argsort), so
//             "ascending key" IS the reference order and no sort is needed.
//   top_k   : the k-th key by a radix select (8-bit digits, counts).
//   probs   : e_i = exp((double)l_i - (double)l_max) over the candidates, S = sum e_i (float64,
//             fixed order: per-thread strided sums, then the block tree), p_i = e_i / S.
//   min_p   : p_i >= min_p * (1/S), per element, as the reference.
//   top_p   : the first key whose inclusive cumulative p reaches top_p, by a radix select on
//             p_i in 2^-60 fixed point (integer sums: exact, order-free, deterministic).
//   draw    : u from Philox4x64-10 (key = seed, counter (position+1, 0, 0, 0): NumPy increments
//             before its first block), the token = first kept key whose cumulative fixed-point
//             p exceeds floor(u * total), again by radix select.
//   The reference sums the float64 probabilities pairwise / sequentially; this kernel's sums
//   differ from those by rounding only (~1e-16 relative), so it returns the reference token
//   unless u*total falls within ~1e-15 of a cumulative boundary (or an element's p within an
//   ulp of a min_p / top_p threshold): never observed in the randomized tests.
//   NaN logits are not supported (the reference's argsort would place them first).
// Params (device, uint64[16], built by cuda_ops.pack_sampling_params; a CUDA graph replays with
//   new values without recapture): [0] temperature f64 bits, [1] top_k, [2] top_p f64,
//   [3] min_p f64, [4] repeat_penalty f64, [5] repeat_last_n, [6] seed bits 0..63,
//   [7] seed bits 64..127, [8] hist_len (ids ever pushed to the ring), [9] flags
//   (bit 0: push the sampled token to the ring and increment hist_len).
// Ring: int32 [R]; id number n (0-based, n < hist_len) lives at ring[n % R].  The penalty uses
//   the last min(repeat_last_n or all, hist_len, R) ids: R must be >= repeat_last_n for the
//   reference's window.
// Position: pos_dev[0] (int32), the `position` argument of sample_token.
// Launch geometry: sample: one block of 1024 threads (single-block multi-pass; each pass reads
//   the L2-resident per-element keys), dynamic smem = histograms (32 warps x 256 bins x 12 B)
//   + penalty bitmap (ceil(V/32) words).  Workspace: keys uint32 [V] + e float64 [V].
//   argmax: same kernel family, one block (first index of the maximum, no penalty).
//   SAMPLE_FIXP=1 (an experiment, cuda_ops BW24CHAT_SAMPLE_FIXP; off by default until measured):
//   the fixed-point weights round((e_i / S) 2^60) are computed once into the workspace's
//   uint64 [V] after S is known, instead of again (one float64 division each) for every element
//   of every radix-select pass and the total; the same values, so the same token.
#include "common.cuh"

#define SNT 1024
#define NWARP (SNT / 32)
#define NBIN 256
#define FIX_ONE 1152921504606846976.0  // 2^60
#ifndef SAMPLE_FIXP
#define SAMPLE_FIXP 0
#endif

// ------------------------------------------------------------------ Philox4x64-10
BW24_DEVICE void philox4x64_10(uint64_t (&c)[4], uint64_t k0, uint64_t k1) {
    const uint64_t M0 = 0xD2E7470EE14C6C93ull, M1 = 0xCA5A826395121157ull;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B97F4A7C15ull; k1 += 0xBB67AE8584CAA73Bull; }
        const uint64_t hi0 = __umul64hi(M0, c[0]), lo0 = M0 * c[0];
        const uint64_t hi1 = __umul64hi(M1, c[2]), lo1 = M1 * c[2];
        const uint64_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

// The first random_raw() of np.random.Philox(key=[k0, k1], counter=[pos, 0, 0, 0]).
BW24_DEVICE uint64_t philox_first_raw(uint64_t k0, uint64_t k1, uint64_t pos) {
    uint64_t c[4] = {pos + 1, pos + 1 == 0 ? 1ull : 0ull, 0, 0};
    philox4x64_10(c, k0, k1);
    return c[0];
}

extern "C" __global__ void philox_raw(const uint64_t* __restrict__ keys, const uint64_t* __restrict__ positions, int n,
                                      uint64_t* __restrict__ out) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox_first_raw(keys[2 * i], keys[2 * i + 1], positions[i]);
}

// ------------------------------------------------------------------ keys
// descending-order key of a float: smaller key = larger value
BW24_DEVICE uint32_t desc_key(float v) {
    if (v == 0.0f) v = 0.0f;  // -0.0 ties with +0.0 (argsort compares values)
    const uint32_t u = __float_as_uint(v);
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~asc;
}
BW24_DEVICE float key_value(uint32_t kd) {
    const uint32_t asc = ~kd;
    return __uint_as_float((asc & 0x80000000u) ? (asc & 0x7FFFFFFFu) : ~asc);
}
BW24_DEVICE uint64_t key64(uint32_t kd, int i) { return ((uint64_t)kd << 32) | (uint32_t)i; }

struct SampleShared {
    uint32_t cnt[NWARP][NBIN];
    unsigned long long mass[NWARP][NBIN];
    unsigned long long red_u64[NWARP];
    double red_f64[NWARP];
    uint64_t s_key;
    uint64_t s_prefix;
    unsigned long long s_before;
    int s_done;
};

BW24_DEVICE uint64_t block_min_u64(uint64_t v, SampleShared& sh) {
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_u64[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t m = sh.red_u64[0];
    for (int i = 1; i < NWARP; ++i) m = sh.red_u64[i] < m ? sh.red_u64[i] : m;
    return m;
}

BW24_DEVICE unsigned long long block_sum_u64(unsigned long long v, SampleShared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_u64[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long s = 0;
    for (int i = 0; i < NWARP; ++i) s += sh.red_u64[i];
    return s;
}

BW24_DEVICE double block_sum_f64(double v, SampleShared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_f64[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < NWARP; ++i) s += sh.red_f64[i];
    return s;
}

// The smallest key64 k in the set {i : in_set(i)} whose inclusive cumulative weight (weights in
// ascending key order) is >= target; the largest key of the set when the total stays below.
// weight(i) returns an integer weight.  8-bit digits from the top; stops when a digit's bin holds
// one element.
template <typename InSet, typename Weight>
BW24_DEVICE uint64_t radix_select(const uint32_t* __restrict__ keys, int V, unsigned long long target, InSet in_set,
                                  Weight weight, SampleShared& sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t prefix = 0;
    unsigned long long before = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < NWARP * NBIN; i += SNT) {
            (&sh.cnt[0][0])[i] = 0;
            (&sh.mass[0][0])[i] = 0;
        }
        __syncthreads();
        const uint64_t hi_mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (int i = threadIdx.x; i < V; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            if ((k & hi_mask) == prefix && in_set(k, i)) {
                const int b = (int)((k >> shift) & 0xFF);
                atomicAdd(&sh.cnt[w][b], 1u);
                atomicAdd(&sh.mass[w][b], weight(k, i));
            }
        }
        __syncthreads();
        // fold the per-warp histograms into row 0 (integer sums: order-free)
        for (int b = threadIdx.x; b < NBIN; b += SNT) {
            uint32_t c = 0;
            unsigned long long m = 0;
            for (int j = 0; j < NWARP; ++j) { c += sh.cnt[j][b]; m += sh.mass[j][b]; }
            sh.cnt[0][b] = c;
            sh.mass[0][b] = m;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long cum = before;
            int chosen = -1, last = -1;
            unsigned long long before_last = before;
            for (int b = 0; b < NBIN; ++b) {
                if (sh.cnt[0][b] == 0) continue;
                last = b;
                before_last = cum;
                if (cum + sh.mass[0][b] >= target) { chosen = b; break; }
                cum += sh.mass[0][b];
            }
            if (chosen < 0) { chosen = last; cum = before_last; }  // total below target: the last element
            sh.s_prefix = prefix | ((uint64_t)(chosen < 0 ? 0 : chosen) << shift);
            sh.s_before = cum;
            sh.s_done = chosen < 0 || sh.cnt[0][chosen] == 1 || shift == 0;
        }
        __syncthreads();
        prefix = sh.s_prefix;
        before = sh.s_before;
        const int done = sh.s_done;
        if (done) {
            if (shift == 0) return prefix;
            // the bin holds one element: find it
            const uint64_t m2 = ~0ull << shift;
            uint64_t best = ~0ull;
            for (int i = threadIdx.x; i < V; i += SNT) {
                const uint64_t k = key64(keys[i], i);
                if ((k & m2) == prefix && in_set(k, i)) best = k < best ? k : best;
            }
            return block_min_u64(best, sh);
        }
        (void)lane;
    }
    return prefix;
}

// Penalized (and, when temp > 0, temperature-scaled) logit of element i.
BW24_DEVICE float scored(const float* __restrict__ logits, int i, const uint32_t* bitmap, bool use_pen, float pen,
                         bool scale, float temp) {
    float l = logits[i];
    if (use_pen && ((bitmap[i >> 5] >> (i & 31)) & 1u)) l = l > 0.0f ? __fdiv_rn(l, pen) : __fmul_rn(l, pen);
    return scale ? __fdiv_rn(l, temp) : l;
}

extern "C" __global__ void __launch_bounds__(SNT)
sample(const float* __restrict__ logits, int V, unsigned long long* __restrict__ params, const int* __restrict__ pos_dev,
       int* __restrict__ ring, int ring_cap, uint32_t* __restrict__ keys, double* __restrict__ e,
       int* __restrict__ out_token) {
    PDL_ENTRY();
    extern __shared__ __align__(16) uint8_t dyn[];
    SampleShared& sh = *reinterpret_cast<SampleShared*>(dyn);
    uint32_t* bitmap = reinterpret_cast<uint32_t*>(dyn + sizeof(SampleShared));
    const int tid = threadIdx.x;

    const double temperature = __longlong_as_double((long long)params[0]);
    const long long top_k = (long long)params[1];
    const double top_p = __longlong_as_double((long long)params[2]);
    const double min_p = __longlong_as_double((long long)params[3]);
    const double penalty = __longlong_as_double((long long)params[4]);
    const long long last_n = (long long)params[5];
    const unsigned long long seed0 = params[6], seed1 = params[7];
    const long long hist_len = (long long)params[8];
    const unsigned long long flags = params[9];

    // 1. repetition penalty: bitmap of the distinct recent ids
    const bool use_pen = penalty != 1.0 && hist_len > 0 && ring_cap > 0;
    const float pen = (float)penalty;
    if (use_pen) {
        const int words = (V + 31) >> 5;
        for (int i = tid; i < words; i += SNT) bitmap[i] = 0;
        __syncthreads();
        long long n = last_n > 0 ? min(last_n, hist_len) : hist_len;
        n = min(n, (long long)ring_cap);
        for (long long j = tid; j < n; j += SNT) {
            const int id = ring[(hist_len - 1 - j) % ring_cap];
            if (id >= 0 && id < V) atomicOr(&bitmap[id >> 5], 1u << (id & 31));
        }
        __syncthreads();
    }
    // 2./3. keys of the (scaled) logits; their minimum is the reference's first candidate
    const bool greedy = temperature <= 0.0;
    const float temp = (float)temperature;
    uint64_t best = ~0ull;
    for (int i = tid; i < V; i += SNT) {
        const uint32_t kd = desc_key(scored(logits, i, bitmap, use_pen, pen, !greedy, temp));
        keys[i] = kd;
        const uint64_t k = key64(kd, i);
        best = k < best ? k : best;
    }
    __syncthreads();
    const uint64_t first = block_min_u64(best, sh);
    int token = (int)(uint32_t)first;
    if (!greedy) {
        // 4. top-k: the k-th key bounds the candidates
        uint64_t kth = ~0ull;
        if (top_k > 0 && top_k < V)
            kth = radix_select(keys, V, (unsigned long long)top_k, [](uint64_t, int) { return true; },
                               [](uint64_t, int) { return 1ull; }, sh);
        // 5. e_i and S over the candidates
        const double c0 = (double)key_value((uint32_t)(first >> 32));
        double part = 0.0;
        for (int i = tid; i < V; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            const double ei = k <= kth ? exp((double)key_value(keys[i]) - c0) : 0.0;
            e[i] = ei;
            part += ei;
        }
        const double S = block_sum_f64(part, sh);
        __syncthreads();  // e[] written by all threads before the selects read it
#if SAMPLE_FIXP
        unsigned long long* fx = reinterpret_cast<unsigned long long*>(e + V);  // the workspace's third array
        for (int i = tid; i < V; i += SNT) fx[i] = __double2ull_rn((e[i] / S) * FIX_ONE);
        __syncthreads();
        auto fixp = [&](uint64_t, int i) -> unsigned long long { return fx[i]; };
#else
        auto fixp = [&](uint64_t, int i) -> unsigned long long { return __double2ull_rn((e[i] / S) * FIX_ONE); };
#endif
        // 6. top-p bound over the candidates, then the kept set
        uint64_t bound = kth;
        if (top_p < 1.0) {
            const double t = ceil(top_p * FIX_ONE);
            const unsigned long long tfix = t <= 0.0 ? 0ull : (unsigned long long)t;
            bound = radix_select(keys, V, tfix, [&](uint64_t k, int) { return k <= kth; }, fixp, sh);
        }
        const double p0 = 1.0 / S;
        const double minp_thr = min_p * p0;
        const bool use_minp = min_p > 0.0;
        auto kept = [&](uint64_t k, int i) -> bool {
            return k <= bound && (!use_minp || (e[i] / S) >= minp_thr);
        };
        unsigned long long tot = 0;
        for (int i = tid; i < V; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            if (kept(k, i)) tot += fixp(k, i);
        }
        const unsigned long long total = block_sum_u64(tot, sh);
        // 7./8. the draw
        if (total > 0) {
            const uint64_t x = philox_first_raw(seed0, seed1, (uint64_t)(long long)pos_dev[0]);
            const double u = (double)(x >> 11) * (1.0 / 9007199254740992.0);
            const unsigned long long tt = (unsigned long long)floor(u * (double)total) + 1ull;
            token = (int)(uint32_t)radix_select(keys, V, tt, kept, fixp, sh);
        }  // else nothing kept (min_p > 1): the reference keeps the first candidate
    }
    if (tid == 0) {
        out_token[0] = token;
        if ((flags & 1ull) && ring_cap > 0) {
            ring[hist_len % ring_cap] = token;
            params[8] = (unsigned long long)(hist_len + 1);
        }
    }
}

// First index of the maximum of x[0..V) (np.argmax without NaNs), one block of 1024 threads.
extern "C" __global__ void __launch_bounds__(SNT)
argmax(const float* __restrict__ x, int V, int* __restrict__ out_token) {
    PDL_ENTRY();
    __shared__ uint64_t red[NWARP];
    uint64_t best = ~0ull;
    for (int i = threadIdx.x; i < V; i += SNT) {
        const uint64_t k = key64(desc_key(x[i]), i);
        best = k < best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xffffffffu, best, o);
        best = w < best ? w : best;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t m = red[0];
        for (int i = 1; i < NWARP; ++i) m = red[i] < m ? red[i] : m;
        out_token[0] = (int)(uint32_t)m;
    }
}
