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
// Rows: one launch samples R rows, each from its own logits row, params, ring, position and
//   output word (a decode step's m rows, a batched pass's rows); row r's token is exactly what a
//   launch of that row alone gives: every row runs the same G-block arithmetic below (the same
//   slices, the same block order of the S sum), whatever R and however rows share the grid.
// Params (device, uint64[16] per row at params + r * params_stride words, built by
//   cuda_ops.pack_sampling_params; a CUDA graph replays with new values without recapture):
//   [0] temperature f64 bits, [1] top_k, [2] top_p f64, [3] min_p f64, [4] repeat_penalty f64,
//   [5] repeat_last_n, [6] seed bits 0..63, [7] seed bits 64..127, [8] hist_len (ids ever pushed
//   to the ring), [9] flags (bit 0: push the sampled token to the ring and increment hist_len).
// Ring: int32 [C] per row at ring + r * ring_stride; id number n (0-based, n < hist_len) lives at
//   ring[n % C].  The penalty uses the last min(repeat_last_n, hist_len, C) ids (repeat_last_n 0:
//   none, as sample_token): C must be >= repeat_last_n for the reference's window.
// Position: pos_dev[r] (int32), the `position` argument of sample_token; token to out_token[r].
// Launch geometry: sample: a grid (G, S) of SNT = 512-thread blocks, G <= MAX_GRID and G * S <=
//   the SM count (cuda_ops.sample_grid: about one block per 2048 logits; cuda_ops.sample_slots),
//   all resident at once: the passes are separated by grid-wide barriers among the G blocks of a
//   slot (spinning on a counter in the slot's workspace); a block's 512 threads take over 64
//   registers each (ptxas), so one block per SM is what the SM count guarantees resident.
//   Slot y (blockIdx.y) samples rows y, y + S, y + 2S, ... in turn.  Block b of a slot owns the
//   slice [b*per, (b+1)*per) of the vocabulary (per = ceil(V/G)) and thread t its elements
//   s0 + t, s0 + t + SNT, ... in every pass, so e / fx / keys are read back only by the thread
//   that wrote them (in every row: a slot's rows reuse its arrays without a barrier).
//   Cross-block sums are integer atomics (order-free) or, for S, the block sums added in block
//   order by every block alike; so the token does not depend on timing, S or the row's slot.
//   Dynamic smem = SampleShared + the slice's penalty bitmap (ceil(per/32) words).
//   Workspace: S slots (sample_slot_bytes apart) of keys uint32 [V], e float64 [V], fixed-point
//   weights uint64 [V], SampleState [2] (zeroed at allocation; the last block out of a row
//   zeroes its state again).  A slot's rows alternate between its two states: the last block out
//   of row k zeroes state k % 2 while the others may already be in row k + 1 on the other one;
//   none reaches row k + 2 before that block has passed row k + 1's first barrier.
//   Why grid-wide: a single block (one SM) makes up to 8 radix passes per select over the whole
//   vocabulary, with every element of the first pass piling onto the few bins of the float's
//   exponent byte (measured ~150 us at V = 49152, docs/performance.md).  Here the first pass starts below the bits
//   that every key shares, and each pass is spread over the SMs.  Why one launch for R rows: a
//   K = 2 verify (3 rows) or a batched pass (up to 64) paid one launch and its tail per row.
//   argmax: one block of ANT = 1024 threads (first index of the maximum, no penalty).
#include "common.cuh"

#define SNT 512
#define NWARP (SNT / 32)
#define NBIN 256
#define MAX_GRID 256
#define ANT 1024
#define FIX_ONE 1152921504606846976.0  // 2^60

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

// ------------------------------------------------------------------ grid-wide state
// In the workspace after keys / e / fx (cuda_ops.sample_workspace_bytes).  All zero between
// launches: the workspace is allocated zeroed and the last block to leave zeroes it again.
// Minima are kept as the maximum of complements so that zero is the neutral start.
struct SampleState {
    unsigned int arrive;               // grid barrier arrivals (monotonic within a launch)
    unsigned int leave;                // blocks done (the last one resets this state)
    unsigned long long first_c;        // ~(min key64): the reference's first candidate
    unsigned long long last;           // max key64
    unsigned long long total;          // sum of the kept fixed-point weights
    unsigned long long found_c[4];     // ~(min key64) of each select's finishing pass
    unsigned int cnt[3][NBIN];         // histogram buffers, rotated per pass (see select)
    unsigned long long mass[3][NBIN];
    double partial[MAX_GRID];          // per-block sums of e (read in block order)
};

struct SampleShared {
    unsigned int cnt[NBIN];
    unsigned long long mass[NBIN];
    unsigned long long scan[NBIN];     // inclusive prefix sums of the pass's bin masses
    unsigned long long red_u64[NWARP];
    double red_f64[NWARP];
    double sum_part[MAX_GRID];
    int chosen;
    int last_block;
};
// cuda_ops._SAMPLE_STATE / _SAMPLE_SHARED size the workspace and the dynamic shared memory
static_assert(sizeof(SampleState) == 8 + 7 * 8 + 3 * NBIN * 12 + MAX_GRID * 8, "cuda_ops._SAMPLE_STATE");
static_assert(sizeof(SampleShared) == NBIN * 20 + 2 * NWARP * 8 + MAX_GRID * 8 + 8, "cuda_ops._SAMPLE_SHARED");

BW24_DEVICE unsigned int ld_acquire_u32(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Grid-wide barrier: every block of the launch is resident (grid <= SM count, one block per SM
// at most is needed; cuda_ops.sample sizes it), so spinning cannot starve a block.  Data written
// before the barrier by other blocks is read after it with __ldcg (L2; L1 is not coherent).
BW24_DEVICE void grid_sync(SampleState* st, unsigned int& target) {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&st->arrive, 1u);
        while (ld_acquire_u32(&st->arrive) < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

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

BW24_DEVICE uint64_t block_max_u64(uint64_t v, SampleShared& sh) { return ~block_min_u64(~v, sh); }

BW24_DEVICE unsigned long long block_sum_u64(unsigned long long v, SampleShared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_u64[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long s = 0;
    for (int i = 0; i < NWARP; ++i) s += sh.red_u64[i];
    return s;
}

// fixed order: xor tree in the warp, then the warps in order
BW24_DEVICE double block_sum_f64(double v, SampleShared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_f64[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < NWARP; ++i) s += sh.red_f64[i];
    return s;
}

// The smallest key64 k of the set {i : in_set(k, i)} whose inclusive cumulative weight (weights
// in ascending key order) is >= target; the largest key of the set when its total stays below.
// weight(k, i) returns an integer weight, so every sum is exact and order-free.
// Radix passes over the bits below the common prefix of all keys (`lo_top`: the highest bit
// where the smallest and largest key64 differ, + 1), 8-bit digits from the top.  Per pass every
// block histograms the elements of its slice that carry the prefix chosen so far (shared
// atomics), adds its bins to a global histogram (global atomics: integer, order-free), and after
// the grid barrier every block scans the same 256 global bins and makes the same choice.  The
// global histograms rotate over three buffers: pass p adds into buffer p % 3 while block 0
// zeroes buffer (p + 1) % 3, which every block finished reading before the barrier that ended
// pass p - 1.  A pass whose chosen bin holds one element ends with one more pass that finds it
// (global minimum).  `pass` counts the passes of the launch; `sel` names the finding slot.
template <typename InSet, typename Weight>
BW24_DEVICE uint64_t radix_select(const uint32_t* __restrict__ keys, int s0, int s1, uint64_t key_first, int lo_top,
                                  unsigned long long target,
                                  InSet in_set, Weight weight, SampleState* st, SampleShared& sh, unsigned int& bar,
                                  int& pass, int sel) {
    const int tid = threadIdx.x;
    uint64_t prefix = lo_top >= 64 ? 0ull : (key_first & (~0ull << lo_top));  // the bits every key shares
    unsigned long long before = 0;
    int top = lo_top;
    while (true) {
        const int lo = max(top - 8, 0), width = top - lo;
        const uint64_t hi_mask = top >= 64 ? 0ull : (~0ull << top);
        const uint64_t dmask = (1ull << width) - 1ull;
        unsigned int* gcnt = st->cnt[pass % 3];
        unsigned long long* gmass = st->mass[pass % 3];
        for (int b = tid; b < NBIN; b += SNT) { sh.cnt[b] = 0; sh.mass[b] = 0; }
        if (blockIdx.x == 0) {
            const int z = (pass + 1) % 3;
            for (int b = tid; b < NBIN; b += SNT) { st->cnt[z][b] = 0; st->mass[z][b] = 0; }
        }
        __syncthreads();
        for (int i = s0 + tid; i < s1; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            if ((k & hi_mask) == prefix && in_set(k, i)) {
                const int b = (int)((k >> lo) & dmask);
                atomicAdd(&sh.cnt[b], 1u);
                atomicAdd(&sh.mass[b], weight(k, i));
            }
        }
        __syncthreads();
        for (int b = tid; b < NBIN; b += SNT)
            if (sh.cnt[b]) { atomicAdd(&gcnt[b], sh.cnt[b]); atomicAdd(&gmass[b], sh.mass[b]); }
        grid_sync(st, bar);
        ++pass;
        // every block: the same scan of the same global bins
        for (int b = tid; b < NBIN; b += SNT) { sh.cnt[b] = __ldcg(&gcnt[b]); sh.mass[b] = __ldcg(&gmass[b]); }
        __syncthreads();
        if (tid < 32) {  // inclusive scan of the 256 masses: 8 per lane, then the lanes
            unsigned long long run = 0;
#pragma unroll
            for (int j = 0; j < NBIN / 32; ++j) { run += sh.mass[tid * (NBIN / 32) + j]; sh.scan[tid * (NBIN / 32) + j] = run; }
            unsigned long long off = run;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long v = __shfl_up_sync(0xffffffffu, off, o);
                if (tid >= o) off += v;
            }
            off -= run;  // exclusive offset of this lane's 8 bins
#pragma unroll
            for (int j = 0; j < NBIN / 32; ++j) sh.scan[tid * (NBIN / 32) + j] += off;
        }
        if (tid == 0) sh.chosen = NBIN;
        __syncthreads();
        for (int b = tid; b < NBIN; b += SNT)
            if (sh.cnt[b] && before + sh.scan[b] >= target) atomicMin(&sh.chosen, b);
        __syncthreads();
        int chosen = sh.chosen;
        if (chosen == NBIN) {  // the set's total is below the target: its last element
            chosen = -1;
            for (int b = NBIN - 1; b >= 0; --b)
                if (sh.cnt[b]) { chosen = b; break; }
        }
        if (chosen < 0) return prefix;  // empty set (not reached by the callers)
        before += sh.scan[chosen] - sh.mass[chosen];
        prefix |= (uint64_t)chosen << lo;
        const bool single = sh.cnt[chosen] == 1;
        __syncthreads();  // sh.* consumed before the next pass rewrites it
        if (lo == 0) return prefix;
        if (single) {  // the bin holds one element: find it
            const uint64_t m2 = ~0ull << lo;
            uint64_t best = ~0ull;
            for (int i = s0 + tid; i < s1; i += SNT) {
                const uint64_t k = key64(keys[i], i);
                if ((k & m2) == prefix && in_set(k, i)) best = k < best ? k : best;
            }
            best = block_min_u64(best, sh);
            if (tid == 0 && best != ~0ull) atomicMax(&st->found_c[sel], ~best);
            grid_sync(st, bar);
            return ~__ldcg(&st->found_c[sel]);
        }
        top = lo;
    }
}

// Penalized (and, when temp > 0, temperature-scaled) logit of element i; bitmap covers the
// block's slice (bit i - s0).
BW24_DEVICE float scored(const float* __restrict__ logits, int i, int s0, const uint32_t* bitmap, bool use_pen, float pen,
                         bool scale, float temp) {
    float l = logits[i];
    const int j = i - s0;
    if (use_pen && ((bitmap[j >> 5] >> (j & 31)) & 1u)) l = l > 0.0f ? __fdiv_rn(l, pen) : __fmul_rn(l, pen);
    return scale ? __fdiv_rn(l, temp) : l;
}

// One row: the G blocks of a slot (blockIdx.y) sample it; the last block out writes the token,
// pushes it to the ring and zeroes the row's state `st`.
BW24_DEVICE void sample_row(const float* __restrict__ logits, int V, unsigned long long* __restrict__ params,
                            int pos, int* __restrict__ ring, int ring_cap, uint32_t* __restrict__ keys,
                            double* __restrict__ e, unsigned long long* __restrict__ fx, SampleState* __restrict__ st,
                            SampleShared& sh, uint32_t* bitmap, int* __restrict__ out_token) {
    const int tid = threadIdx.x;
    const int per = (V + (int)gridDim.x - 1) / (int)gridDim.x;
    const int s0 = min(V, (int)blockIdx.x * per), s1 = min(V, s0 + per);
    unsigned int bar = 0;
    int pass = 0;

    const double temperature = __longlong_as_double((long long)params[0]);
    const long long top_k = (long long)params[1];
    const double top_p = __longlong_as_double((long long)params[2]);
    const double min_p = __longlong_as_double((long long)params[3]);
    const double penalty = __longlong_as_double((long long)params[4]);
    const long long last_n = (long long)params[5];
    const unsigned long long seed0 = params[6], seed1 = params[7];
    const long long hist_len = (long long)params[8];
    const unsigned long long flags = params[9];

    // 1. repetition penalty: bitmap of the distinct recent ids that fall in this block's slice
    const bool use_pen = penalty != 1.0 && last_n > 0 && hist_len > 0 && ring_cap > 0;
    const float pen = (float)penalty;
    if (use_pen) {
        for (int w = tid; w < (per + 31) / 32; w += SNT) bitmap[w] = 0;
        __syncthreads();
        const long long n = min(min(last_n, hist_len), (long long)ring_cap);
        for (long long j = tid; j < n; j += SNT) {
            const int id = ring[(hist_len - 1 - j) % ring_cap];
            if (id >= s0 && id < s1) atomicOr(&bitmap[(id - s0) >> 5], 1u << ((id - s0) & 31));
        }
        __syncthreads();
    }
    // 2./3. keys of the (scaled) logits; the smallest is the reference's first candidate
    const bool greedy = temperature <= 0.0;
    const float temp = (float)temperature;
    uint64_t kmin = ~0ull, kmax = 0;
    for (int i = s0 + tid; i < s1; i += SNT) {
        const uint32_t kd = desc_key(scored(logits, i, s0, bitmap, use_pen, pen, !greedy, temp));
        keys[i] = kd;
        const uint64_t k = key64(kd, i);
        kmin = k < kmin ? k : kmin;
        kmax = k > kmax ? k : kmax;
    }
    kmin = block_min_u64(kmin, sh);
    kmax = block_max_u64(kmax, sh);
    if (tid == 0 && s0 < s1) { atomicMax(&st->first_c, ~kmin); atomicMax(&st->last, kmax); }
    grid_sync(st, bar);
    const uint64_t first = ~__ldcg(&st->first_c), last = __ldcg(&st->last);
    int token = (int)(uint32_t)first;
    // the radix passes start below the bits every key shares
    const int lo_top = first == last ? 0 : 64 - __clzll((long long)(first ^ last));
    if (!greedy && first != last) {
        // 4. top-k: the k-th key bounds the candidates
        uint64_t kth = ~0ull;
        if (top_k > 0 && top_k < V)
            kth = radix_select(keys, s0, s1, first, lo_top, (unsigned long long)top_k, [](uint64_t, int) { return true; },
                               [](uint64_t, int) { return 1ull; }, st, sh, bar, pass, 0);
        // 5. e_i and S over the candidates: S sums the block sums in block order (every block
        //    the same order, so every block gets the same S)
        const double c0 = (double)key_value((uint32_t)(first >> 32));
        double part = 0.0;
        for (int i = s0 + tid; i < s1; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            const double ei = k <= kth ? exp((double)key_value(keys[i]) - c0) : 0.0;
            e[i] = ei;
            part += ei;
        }
        part = block_sum_f64(part, sh);
        if (tid == 0) __stcg(&st->partial[blockIdx.x], part);
        grid_sync(st, bar);
        for (int b = tid; b < (int)gridDim.x; b += SNT) sh.sum_part[b] = __ldcg(&st->partial[b]);
        __syncthreads();
        double S = 0.0;
        for (int b = 0; b < (int)gridDim.x; ++b) S += sh.sum_part[b];
        // the fixed-point weights round(p_i 2^60), once per element
        for (int i = s0 + tid; i < s1; i += SNT) fx[i] = __double2ull_rn((e[i] / S) * FIX_ONE);
        auto fixp = [&](uint64_t, int i) -> unsigned long long { return fx[i]; };
        // 6. top-p bound over the candidates, then the kept set
        uint64_t bound = kth;
        if (top_p < 1.0) {
            const double t = ceil(top_p * FIX_ONE);
            const unsigned long long tfix = t <= 0.0 ? 0ull : (unsigned long long)t;
            bound = radix_select(keys, s0, s1, first, lo_top, tfix, [&](uint64_t k, int) { return k <= kth; }, fixp, st, sh, bar,
                                 pass, 1);
        }
        const double p0 = 1.0 / S;
        const double minp_thr = min_p * p0;
        const bool use_minp = min_p > 0.0;
        auto kept = [&](uint64_t k, int i) -> bool {
            return k <= bound && (!use_minp || (e[i] / S) >= minp_thr);
        };
        unsigned long long tot = 0;
        for (int i = s0 + tid; i < s1; i += SNT) {
            const uint64_t k = key64(keys[i], i);
            if (kept(k, i)) tot += fx[i];
        }
        tot = block_sum_u64(tot, sh);
        if (tid == 0 && tot) atomicAdd(&st->total, tot);
        grid_sync(st, bar);
        const unsigned long long total = __ldcg(&st->total);
        // 7./8. the draw
        if (total > 0) {
            const uint64_t x = philox_first_raw(seed0, seed1, (uint64_t)(long long)pos);
            const double u = (double)(x >> 11) * (1.0 / 9007199254740992.0);
            const unsigned long long tt = (unsigned long long)floor(u * (double)total) + 1ull;
            token = (int)(uint32_t)radix_select(keys, s0, s1, first, lo_top, tt, kept, fixp, st, sh, bar, pass, 2);
        }  // else nothing kept (min_p > 1): the reference keeps the first candidate
    }
    // leave: the last block out writes the token and zeroes the state for the slot's row after next
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        sh.last_block = atomicAdd(&st->leave, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (sh.last_block) {
        __threadfence();
        for (int b = tid; b < 3 * NBIN; b += SNT) { (&st->cnt[0][0])[b] = 0; (&st->mass[0][0])[b] = 0; }
        for (int b = tid; b < MAX_GRID; b += SNT) st->partial[b] = 0.0;
        if (tid == 0) {
            st->first_c = 0; st->last = 0; st->total = 0;
            for (int j = 0; j < 4; ++j) st->found_c[j] = 0;
            st->arrive = 0; st->leave = 0;
            out_token[0] = token;
            if ((flags & 1ull) && ring_cap > 0) {
                ring[hist_len % ring_cap] = token;
                params[8] = (unsigned long long)(hist_len + 1);
            }
        }
    }
    // the zeroed state before this block's next barrier (whose thread 0 fences first); sh.* free again
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(SNT, 1)
sample(const float* __restrict__ logits, int V, long long logits_stride, int R, unsigned long long* __restrict__ params,
       int params_stride, const int* __restrict__ pos_dev, int* __restrict__ ring, int ring_stride, int ring_cap,
       uint8_t* __restrict__ ws, long long slot_bytes, int* __restrict__ out_token) {
    PDL_ENTRY();
    extern __shared__ __align__(16) uint8_t dyn[];
    SampleShared& sh = *reinterpret_cast<SampleShared*>(dyn);
    uint32_t* bitmap = reinterpret_cast<uint32_t*>(dyn + sizeof(SampleShared));  // the slice's penalized ids
    // the slot's workspace: keys [V] | e [V] | fx [V] | SampleState [2] (cuda_ops._sample_layout)
    uint8_t* base = ws + (long long)blockIdx.y * slot_bytes;
    const long long e_off = ((long long)V * 4 + 7) / 8 * 8, fx_off = e_off + (long long)V * 8, st_off = fx_off + (long long)V * 8;
    uint32_t* keys = reinterpret_cast<uint32_t*>(base);
    double* e = reinterpret_cast<double*>(base + e_off);
    unsigned long long* fx = reinterpret_cast<unsigned long long*>(base + fx_off);
    SampleState* st = reinterpret_cast<SampleState*>(base + st_off);
    int k = 0;
    for (int r = blockIdx.y; r < R; r += gridDim.y, ++k)
        sample_row(logits + r * logits_stride, V, params + (long long)r * params_stride, pos_dev[r],
                   ring + (long long)r * ring_stride, ring_cap, keys, e, fx, st + (k & 1), sh, bitmap, out_token + r);
}

// First index of the maximum of x[0..V) (np.argmax without NaNs), one block of ANT threads.
extern "C" __global__ void __launch_bounds__(ANT)
argmax(const float* __restrict__ x, int V, int* __restrict__ out_token) {
    PDL_ENTRY();
    __shared__ uint64_t red[ANT / 32];
    uint64_t best = ~0ull;
    for (int i = threadIdx.x; i < V; i += ANT) {
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
        for (int i = 1; i < ANT / 32; ++i) m = red[i] < m ? red[i] : m;
        out_token[0] = (int)(uint32_t)m;
    }
}
