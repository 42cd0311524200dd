// moe_experts.cu — the routed experts of a decode step (m = 1..8 rows), on the resident dense
// layouts of one format (formats.cuh), and the prefill's combine.
//
// Contract (ops.Ops.experts; NumPy reference NumpyOps.experts)
//   Expert storage: per projection a device table tab u64 [E, 5] = the plane pointers {q, h, s,
//   d, gscale} of expert e (0 where the format has no such plane), each the dense resident layout
//   of cuda_weights.repack_host for one expert (gate|up interleaved: rows 2i = gate_i, 2i+1 =
//   up_i).  The kernels read only the table, so a later VRAM / host tier that moves an expert's
//   planes rewrites its row of the table and nothing else (cuda_moe.ExpertStore).
//   Held experts: this GPU computes the experts lo <= e < hi (one GPU: 0, E; a model split over
//     several, cuda_sharded.py: its range, the other table rows null).  An expert held elsewhere
//     is skipped: its act slot is not written and its y_j counts as 0 (NumpyOps.experts' zeros).
//   moe_gu(tab, x, normw, ids, act, D, F, k, E, pro, xb16, eps, lo, hi): for row t = blockIdx.y,
//     every held slot j < k and pair i < F: e = ids[t, j], y = gu_e @ xin[t] (2F rows),
//     act[t, j, i] = swiglu_act(y[2i], y[2i+1]) (common.cuh).  pro 1: xin = (x * inv) * normw,
//     inv = rms_inv(sum of x^2 in the fixed order below) (the deferred rmsnorm); 0: xin = x.
//   moe_down(tab, act, ids, w, shared, res, D, F, k, E, rb, xb16, lo, hi, add): for row t =
//     blockIdx.y and output o: y_j = down_{ids[t,j]}[o] . act[t, j] (0 if held elsewhere);
//     acc = w_0 * y_0;  acc = acc + w_j * y_j, j = 1..k-1 (each product rounded: __fmul_rn, no
//     FMA);  acc = acc + shared[t, o] (if shared);  res[t, o] = (add ? res[t, o] : +0) + acc (in
//     place: the residual stream; add 0: a GPU's partial sum).  rb: outputs per block.
//   moe_combine(Y, w, shared, res, T, D, k, pos, ids, lo, hi, add): the prefill's combine, the same
//     order as moe_down, of y_j = Y[pos[t k + j]] (Y [T k, D]: the grouped GEMMs' rows,
//     moe_group.cu; pos null: row t k + j; 0 where ids[t, j] is held elsewhere).
//   The activations of every product: xin rounded to bf16 first with xb16 (the bf16-activation
//   contract), then, for the integer-dot formats (ACT_Q8 = kernel_refs.act_q8), quantized per 32
//   inputs by common.cuh act_quant_lane into their exact f32 values 2^e (h + l/256) —
//   kernel_refs.act_quant_ref, what NumpyOps.linear computes for an ActQuantMatrix.  The dot:
//   ACT_Q8, the dense matvec's integer dot (dot_a8.cuh chunk_dot_a8, matvec.cu's ACT_Q8 contract:
//   per chunk the exact dp4a dots of the weight codes with the two x code levels, scaled once);
//   otherwise (BF16, F16, F32, Q4_0, Q4_1, Q5_0, Q5_1) the exact decoded weights (formats.cuh
//   decode_exact) times xin, __fmaf_rn per value; times the per-row global scale (NVFP4) on the
//   finished sum.  The same numbers as the reference up to f32 rounding (the reference sums
//   act_quant_ref(xin) @ W.T in its own order).
// Exactness: the sum of an output row (y[2i], y[2i+1] for gu, y_j[o] for down) is one LANE
//   GROUP's: a warp for gu (G = 32), 8 lanes for down (G = MOE_DG, a constant of the contract:
//   F / VPC = 24 or 48 chunks at F = 768 leave no lane idle).  Lane l of the group takes the row's
//   chunks l, l+G, ... in order into its sum from 0 (chunk_dot_a8's operations, or one
//   __fmaf_rn per value), then the group's xor tree (common.cuh warp_sum<G>).  down's y_j meet in
//   the warp's shared memory and lane i of the warp owning output o combines them in ranking
//   order.  The rmsnorm statistic: thread i < 128 sums the squares of inputs 4i..4i+3, 4i+512..
//   in order (__fadd_rn of __fmul_rn), warp_sum, then the 4 warps in order; staging is per value
//   (per 32-input block with ACT_Q8).  Nothing depends on m, on the grid or on the geometry
//   (MOE_NW, MOE_U, MOE_R, rb), so row t of an m-row step equals the one-row step bit for bit
//   (speculative verify = plain decode), graph or eager, on any GPU.
// Layout: xin staged per SEGMENT (gu: the D inputs; down: each expert's F) in shared memory:
//   ACT_Q8, dot_a8.cuh's code words and block records; otherwise floats swizzled as matvec.cu's
//   (value e of chunk kc at (kc/32)*WT + (e/4)*128 + 4*(kc%32) + e%4, WT = 32*VPC).  Either way the
//   16-byte reads of 8 lanes on consecutive chunks (one phase of a warp's shared-memory access)
//   are 128 contiguous bytes: no bank conflicts.
// Streaming: a block takes a contiguous share of its row's work, each warp a contiguous share of
//   the block's, in UNITS of one lane group: gu a gate / up pair (rows 2i, 2i+1 of one expert),
//   down MOE_R consecutive outputs of one expert, ordered (outputs, expert) so that a warp's
//   outputs are whole (its combine stays in the warp: __syncwarp, no block barrier).  A warp's
//   SEGMENT is 32/G units side by side; its round c is the ITEM "chunk l + G c of each of its
//   rows"; each lane keeps MOE_U items of 16-byte loads in flight (a rolling window that runs on
//   across segments, refilled as each item is consumed, so a segment's end does not drain the
//   loads), and the first window goes out before the block stages x (gu: and sums the rmsnorm
//   statistic).  The block copies the whole expert table (E x 40 B) to shared memory (cp.async,
//   issued before its pdl_wait), then reads its row's k ids (down: and the weights w, the
//   residual and shared rows of its outputs): one L2 round trip between the router's ids and the
//   first weight loads.  tuning.MOE_TUNING holds the geometry; the grid fills the GPU's SMs at the
//   wrapper's resident blocks per SM.
//
// Napkin math (Qwen3-30B-A3B: D 2048, F 768, k 8 of E 128, 48 layers; batch 1; H100 1.75 GHz):
//   weights read per token and layer = k (gu 2F*D + down D*F) = 8 x 3 x 2048 x 768 = 37.7 M
//   values: BF16 75.5 MB, Q8_0 (34/32 B) 40.1 MB, NVFP4 (9/16 B) 21.2 MB; 48 layers: BF16 3.62 GB,
//   Q8_0 1.93 GB, NVFP4 1.02 GB per token, plus the F32 router 1 MB a layer (48 MB).
//   Roofline at 3.0 TB/s (H100): gu / down BF16 16.8 / 8.4 us a layer, Q8_0 8.9 / 4.5 us, NVFP4
//   4.7 / 2.4 us; at 4.2 TB/s (H200) 0.71x.  Per SM (132): Q8_0 gu 202 KB, down 101 KB, streamed
//   at ~23 GB/s (13 B a clock) each, so ~35 KB must be in flight per SM at ~1.5 us of loaded
//   latency; 16 warps with MOE_U = 6 items of 2 rows (gu) / 1 row (down) x 18 B per lane hold 110
//   / 55 KB.  Work to spread at m = 1: gu 8 x 768 pairs (~47 a block on 132 blocks, ~3 a warp),
//   down 2048 outputs x 8 experts (16 outputs a block on 128 blocks: one a warp, its 8 units in 2
//   segments of 4: 6 (32-value chunks) or 12 (Q8_0) items a lane, no lane idle; the old warp per
//   (output, expert) left a quarter of its lanes idle on 24 or 48 chunks).
//   Arithmetic, lane instructions per weight of a steady item (sm_90a SASS: the dot, its x loads
//   from shared memory, the refill and the loop): integer dot Q8_0 ~2.3 (gu, 2 rows share each x
//   read) / ~3.2 (down), NVFP4 ~2.9 / ~3.5 (PRMT decode of the E2M1 codes); the float dot was ~4
//   (Q8_0) and ~6 (NVFP4) for the products alone.  Against 128 lane instructions per clock of an
//   SM taking 13 B a clock (12.2 Q8_0 or 23 NVFP4 weights): Q8_0 ~22 / 30 %, NVFP4 ~52 / 63 % of
//   the issue rate (the float dot: Q8_0 ~40 %, NVFP4 all of it), so the stream, not the dot,
//   bounds both, NVFP4 with the least margin.
//   x staging: act_quant_lane and the stores ~25 lane instructions per input; gu quantizes D per
//   block (2048: ~0.2 us of an SM's issue), down k*F (6144: ~0.7 us at one block of 16 warps per
//   SM; two blocks of 8 warps quantize it twice), under the first window's loads; the loads of
//   x go out in batches (one L2 round trip each).
#include "common.cuh"
#include "formats.cuh"

#ifndef ACT_Q8
#define ACT_Q8 0
#endif
#if ACT_Q8 && IS_FLOAT_FMT
#error "ACT_Q8 is the integer-dot contract of the quantized formats"
#endif
#if ACT_Q8
#include "dot_a8.cuh"
#endif
#ifndef MOE_NW  // warps per block: 4, 8 or 16
#define MOE_NW 8
#endif
#if MOE_NW != 4 && MOE_NW != 8 && MOE_NW != 16
#error "MOE_NW: 4, 8 or 16 warps per block"
#endif
#ifndef MOE_U  // items in flight per lane (the rolling window)
#define MOE_U 4
#endif
#ifndef MOE_R  // outputs per unit of moe_down (moe_gu's unit is its gate / up pair)
#define MOE_R 1
#endif
#ifndef MOE_MINB  // blocks per SM the register budget must allow
#define MOE_MINB 2
#endif
#ifndef MOE_HELD  // 1: this GPU holds a range of the experts (a model split over several GPUs)
#define MOE_HELD 0
#endif
#define MOE_NT (MOE_NW * 32)
#define MOE_DG 8      // lanes per unit of moe_down: its reduction tree, part of the contract (not geometry)
#define STAT_NT 128   // threads of the rmsnorm statistic (its order: the header)
#define MOE_MAX_K 32  // experts per row (moe_router's limit)
#define WT (32 * VPC)

// swizzled shared position of natural input i (i % 4 == 0: the float4 of inputs i..i+3)
BW24_DEVICE int swz(int i) {
    const int kc = i / VPC, e = i % VPC;
    return (kc >> 5) * WT + (e >> 2) * 128 + 4 * (kc & 31) + (e & 3);
}

BW24_DEVICE int padded(int n) { return (n + WT - 1) / WT * WT; }

// One staged x segment of n inputs in shared memory: ACT_Q8, dot_a8.cuh's code words (plane h;
// plane l at + n/4) and records (2 per 32-input block); else the swizzled floats.  Segment s of
// nseg (each of n inputs) in the staging area xs: words at s * n/2 (all segments' words first),
// records after them at s * 2 (n/32); floats at s * padded(n).
struct XSeg {
#if ACT_Q8
    const uint32_t* w;
    const uint4* meta;
#else
    const float* f;
#endif
};
BW24_DEVICE XSeg xseg(const void* xs, int s, int nseg, int n) {
#if ACT_Q8
    const uint32_t* w = reinterpret_cast<const uint32_t*>(xs);
    return XSeg{w + s * (n / 2), reinterpret_cast<const uint4*>(w + nseg * (n / 2)) + s * 2 * (n / 32)};
#else
    (void)nseg;
    return XSeg{reinterpret_cast<const float*>(xs) + s * padded(n)};
#endif
}

// xin of nseg segments of n inputs each (x: nseg * n floats) into the staging area xs (XSeg):
// scaled by inv * normw (pro 1), rounded to bf16 (xb16), quantized per 32 (ACT_Q8: dot_a8.cuh
// a8_stage_group).  Float4 groups in batches of NB per thread whose loads go out together (one L2
// round trip a batch; the registers they take are live beside the first window's).  Whole warps
// run it (the quantization's shuffles; a 32-input block is the 8 lanes of one aligned group); n a
// multiple of 32 with ACT_Q8, of 4 without.
template <int NB>
BW24_DEVICE void stage(void* xs, const float* __restrict__ x, int nseg, int n, int pro, float inv,
                       const float* __restrict__ normw, int xb16) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tot = nseg * n;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int b0 = warp * 128; b0 < tot; b0 += MOE_NT * 4 * NB) {
        float4 v[NB], g[NB];
#pragma unroll
        for (int q = 0; q < NB; ++q) {
            const int i = b0 + q * MOE_NT * 4 + 4 * lane;
            v[q] = i < tot ? *reinterpret_cast<const float4*>(x + i) : zero;
            g[q] = pro == 1 && i < tot ? *reinterpret_cast<const float4*>(normw + i) : zero;
        }
#pragma unroll
        for (int q = 0; q < NB; ++q) {
            const int i = b0 + q * MOE_NT * 4 + 4 * lane;
            if (b0 + q * MOE_NT * 4 >= tot) break;  // warp-uniform: no group of this batch's row q left
            float4 a = v[q];
            if (pro == 1)
                a = make_float4(__fmul_rn(__fmul_rn(a.x, inv), g[q].x), __fmul_rn(__fmul_rn(a.y, inv), g[q].y),
                                __fmul_rn(__fmul_rn(a.z, inv), g[q].z), __fmul_rn(__fmul_rn(a.w, inv), g[q].w));
            if (xb16) a = bf16_round4(a);
            const int sg = min(i, tot - 1) / n, p = i - sg * n;
#if ACT_Q8
            uint32_t* w = reinterpret_cast<uint32_t*>(xs);
            uint4* meta = reinterpret_cast<uint4*>(w + nseg * (n / 2));
            // segment sg is A8Planes' token sg (its codes(sg), recs(sg), as xseg computes them)
            a8_stage_group(p / 4, a, i < tot, w + sg * (n / 2), meta + sg * 2 * (n / 32), n / VPC, A8Planes{w, meta, n / 4, n / 32, n / 4});
#else
            if (i < tot) *reinterpret_cast<float4*>(reinterpret_cast<float*>(xs) + sg * padded(n) + swz(p)) = a;
#endif
        }
    }
}

// The whole expert table (E rows of 5 pointers) into shared memory, issued before pdl_wait (no
// kernel writes it: the tiers rewrite it by copies between graphs) as cp.async, so the ids' load
// goes out without waiting for it; the caller waits (cp_async_wait) before its barrier
BW24_DEVICE void load_table(const unsigned long long* __restrict__ tab, int E, unsigned long long* tabs) {
    for (int i = threadIdx.x; 2 * i < 5 * E; i += MOE_NT)
        cp_async16(tabs + 2 * i, tab + 2 * i, 2 * i + 1 < 5 * E ? 16 : 8);  // E odd: the last half unit
    cp_async_commit();
}

// The ids of row t's k experts into shared memory
BW24_DEVICE void load_ids(const int* __restrict__ idt, int k, int* ids_s) {
    if ((int)threadIdx.x < k) ids_s[threadIdx.x] = idt[threadIdx.x];
}

// The slots j < k of a row's experts that this GPU holds (lo <= ids[j] < hi): kh of them, the
// q-th at slot(q), has(j) whether slot j is held.  Every thread builds it from the staged ids (no
// barrier).  The MOE_HELD build (only for a GPU of a split model: cuda_moe CudaExperts.partial,
// cuda_sharded.py) keeps the mask; the one-GPU build holds every slot, in order.
struct Held {
#if MOE_HELD
    unsigned m;
    int kh, k;
    BW24_DEVICE int slot(int q) const { return kh == k ? q : (int)__fns(m, 0, q + 1); }
    BW24_DEVICE bool has(int j) const { return (m >> j) & 1u; }
#else
    int kh;
    BW24_DEVICE int slot(int q) const { return q; }
    BW24_DEVICE bool has(int) const { return true; }
#endif
};

BW24_DEVICE Held held_slots(const int* ids_s, int k, int lo, int hi) {
#if MOE_HELD
    unsigned m = 0;
    for (int j = 0; j < k; ++j) m |= (ids_s[j] >= lo && ids_s[j] < hi ? 1u : 0u) << j;
    return Held{m, __popc(m), k};
#else
    (void)ids_s; (void)lo; (void)hi;
    return Held{k};
#endif
}

// planes of row `row` of the expert whose table row is te (shared memory)
BW24_DEVICE RowPlanes table_row(const unsigned long long* te, long row, int nck) {
    return row_planes((const uint4*)te[0], (const void*)te[1], (const void*)te[2], (const void*)te[3], row, nck);
}

BW24_DEVICE float finish(float sum, float gs) {
#if FMT == F_NVFP4
    return __fmul_rn(sum, gs);
#else
    (void)gs;
    return sum;
#endif
}

// One item's products: chunk kc of R rows (c) against the staged x segment xb (nck chunks) into
// acc.  ACT_Q8: dot_a8.cuh chunk_dot_a8 (nv_t0: nv_table_word); otherwise value by value in natural
// order (the 32-value formats half a chunk at a time: the same operations in the same order,
// half the decoded values and x live)
template <int R>
BW24_DEVICE void item_dot(const Raw (&c)[R], int kc, int nck, const XSeg& xb, uint32_t nv_t0, float (&acc)[1][R]) {
#if ACT_Q8
    chunk_dot_a8<1, R>(c, kc, nck, xb.w, nck * (VPC / 4), xb.meta, nck * VPC / 32, nv_t0, acc);
#else
    (void)nck; (void)nv_t0;
    const float* xw = xb.f + (kc >> 5) * WT + 4 * (kc & 31);
#if VPC == 32
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float xv[16];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const float4 f = *reinterpret_cast<const float4*>(xw + (4 * h + g) * 128);
            xv[4 * g] = f.x;
            xv[4 * g + 1] = f.y;
            xv[4 * g + 2] = f.z;
            xv[4 * g + 3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float v[16];
            decode_half(c[r], kc, h, v);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[0][r] = __fmaf_rn(v[e], xv[e], acc[0][r]);
        }
    }
#else
    float xv[VPC];
#pragma unroll
    for (int g = 0; g < VPC / 4; ++g) {
        const float4 f = *reinterpret_cast<const float4*>(xw + g * 128);
        xv[4 * g] = f.x;
        xv[4 * g + 1] = f.y;
        xv[4 * g + 2] = f.z;
        xv[4 * g + 3] = f.w;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v[VPC];
        decode_exact(c[r], kc, v);
#pragma unroll
        for (int e = 0; e < VPC; ++e) acc[0][r] = __fmaf_rn(v[e], xv[e], acc[0][r]);
    }
#endif
#endif
}

// One warp's stream of nseg segments, each 32/G units (one a lane group) of R rows, nr =
// ceil(nck / G) items each (the header).  Per lane (its group's unit of each segment):
//   rows(rp, gp): the planes of the next segment's rows and (NVFP4) their global-scale pointers
//     (segments 0, 1, ... in order);
//   prologue(): the block's x staging, run by every warp once its first window is out (barriers);
//   xbase(): the next segment's staged x (segments in order);  done(acc, gs): the segment's lane
//     sums and row scales, called by every lane at once (the group reductions are shuffles).
// Items are consumed in order; slot u of the window is refilled with the item MOE_U further on
// (the next segment's, past this one's end) as soon as it is consumed (after its products, so the
// slot's registers take the new loads in place).
template <int R, int G, class Rows, class Prologue, class XBase, class Done>
BW24_DEVICE void stream_segments(int nseg, int nck, Rows rows, Prologue prologue, XBase xbase, Done done) {
    const int l = threadIdx.x & (G - 1), nr = (nck + G - 1) / G, n = nseg * nr;
#if ACT_Q8
    const uint32_t nv_t0 = nv_table_word();
#else
    const uint32_t nv_t0 = 0;
#endif
    Raw win[MOE_U][R];
    float wgs[MOE_U][R];
    RowPlanes rp[R];
    const float* gp[R];
    int fs = 0, fc = 0;  // the refill cursor: segment, round
    if (nseg > 0) rows(rp, gp);
    auto refill = [&](int u) {
        if (fs >= nseg) return;
        const int kc = l + G * fc;
        if (kc < nck) {
#pragma unroll
            for (int r = 0; r < R; ++r) fetch_chunk_at(win[u][r], rp[r], kc);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#if FMT == F_NVFP4
            wgs[u][r] = __ldg(gp[r]);
#else
            wgs[u][r] = 1.0f;
#endif
        }
        if (++fc == nr) {
            fc = 0;
            if (++fs < nseg) rows(rp, gp);
        }
    };
#pragma unroll
    for (int u = 0; u < MOE_U; ++u) refill(u);
    prologue();
    float acc[1][R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[0][r] = 0.0f;
    int cc = 0;  // the consume cursor's round
    XSeg xb = nseg > 0 ? xbase() : XSeg{};
    for (int i0 = 0; i0 < n; i0 += MOE_U) {
#pragma unroll
        for (int u = 0; u < MOE_U; ++u) {
            if (i0 + u < n) {
                const int kc = l + G * cc;
                if (kc < nck) item_dot<R>(win[u], kc, nck, xb, nv_t0, acc);
                if (++cc == nr) {
                    done(acc[0], wgs[u]);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[0][r] = 0.0f;
                    cc = 0;
                    if (i0 + u + 1 < n) xb = xbase();
                }
                refill(u);
            }
        }
    }
}

// A unit's place (q, j) in a sequence of units q * k + j, moved on by `step` units (k experts a
// set of outputs): no division in the streaming loops
struct UnitCursor {
    int q, j;
    BW24_DEVICE void next(int step, int k) {
        j += step;
        while (j >= k) {
            j -= k;
            ++q;
        }
    }
};

extern "C" __global__ void __launch_bounds__(MOE_NT, MOE_MINB)
moe_gu(const unsigned long long* __restrict__ tab, const float* __restrict__ x, const float* __restrict__ normw,
       const int* __restrict__ ids, float* __restrict__ act, int D, int F, int k, int E, int pro, int xb16, float eps,
       int lo, int hi) {
    extern __shared__ float4 smem4[];
    unsigned long long* tabs = reinterpret_cast<unsigned long long*>(smem4);  // [5E], padded to 16 bytes
    void* xs = tabs + ((5 * E + 1) & ~1);                                     // the staged x (XSeg)
    __shared__ int ids_s[MOE_MAX_K];
    __shared__ float red[STAT_NT / 32];
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* xt = x + (long)t * D;
    const int* idt = ids + (long)t * k;
    load_table(tab, E, tabs);
    pdl_wait();
    load_ids(idt, k, ids_s);
    cp_async_wait<0>();
    __syncthreads();
    // this warp's pairs tau in [a, b) of the row's kh*F (tau = q*F + i: rows 2i, 2i+1 of the q-th
    // held expert, at slot slot(q); the slots of experts held elsewhere are left unwritten)
    const Held hs = held_slots(ids_s, k, lo, hi);
    const int kh = hs.kh;
    auto slot = [&](int q) { return hs.slot(q); };
    const long N = (long)kh * F;
    const long b0 = N * blockIdx.x / gridDim.x, nb = N * (blockIdx.x + 1) / gridDim.x - b0;
    const int a = (int)(b0 + nb * warp / MOE_NW), b = (int)(b0 + nb * (warp + 1) / MOE_NW);
    const int nck = D / VPC;
    // the pair cursors (tau = j*F + i) of the refills and of the results
    UnitCursor fp{a / F, a - (a / F) * F}, dp = fp;
    stream_segments<2, 32>(
        b - a, nck,
        [&](RowPlanes (&rp)[2], const float* (&gp)[2]) {
            const unsigned long long* te = tabs + 5 * ids_s[slot(fp.q)];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                rp[r] = table_row(te, 2L * fp.j + r, nck);
                gp[r] = (const float*)te[4] + 2L * fp.j + r;
            }
            fp.next(1, F);
        },
        [&]() {
            float inv = 1.0f;
            if (pro == 1) {  // the rmsnorm statistic (the header's order), its loads in batches of 2048 inputs
                if (tid < STAT_NT) {
                    float ss = 0.0f;
                    for (int i0 = 4 * tid; i0 < D; i0 += 4 * STAT_NT * 4) {
                        float4 v[4];
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int i = i0 + 4 * STAT_NT * q;
                            v[q] = i < D ? *reinterpret_cast<const float4*>(xt + i) : make_float4(0.f, 0.f, 0.f, 0.f);
                        }
#pragma unroll
                        for (int q = 0; q < 4; ++q) {  // the zeros past D add +0 to a sum >= +0: no change
                            ss = __fadd_rn(ss, __fmul_rn(v[q].x, v[q].x));
                            ss = __fadd_rn(ss, __fmul_rn(v[q].y, v[q].y));
                            ss = __fadd_rn(ss, __fmul_rn(v[q].z, v[q].z));
                            ss = __fadd_rn(ss, __fmul_rn(v[q].w, v[q].w));
                        }
                    }
                    ss = warp_sum(ss);
                    if (lane == 0) red[warp] = ss;
                }
                __syncthreads();
                float tot = red[0];
                for (int w = 1; w < STAT_NT / 32; ++w) tot = __fadd_rn(tot, red[w]);
                inv = rms_inv(tot, D, eps);
            }
            stage<2>(xs, xt, 1, D, pro, inv, normw, xb16);  // 1 batch up to D = 256 * MOE_NW
            __syncthreads();
        },
        [&]() { return xseg(xs, 0, 1, D); },
        [&](const float (&acc)[2], const float (&gs)[2]) {
            const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
            if (lane == 0) act[((long)t * k + slot(dp.q)) * F + dp.j] = swiglu_act(finish(g, gs[0]), finish(u, gs[1]));
            dp.next(1, F);
        });
    pdl_trigger();  // this warp's weight stream is done: the next kernel may start
}

extern "C" __global__ void __launch_bounds__(MOE_NT, MOE_MINB)
moe_down(const unsigned long long* __restrict__ tab, const float* __restrict__ act, const int* __restrict__ ids,
         const float* __restrict__ w, const float* __restrict__ shared, float* __restrict__ res, int D, int F, int k, int E,
         int rb, int xb16, int lo, int hi, int add) {
    extern __shared__ float4 smem4[];
    const int rbp = (rb + 3) & ~3;
    unsigned long long* tabs = reinterpret_cast<unsigned long long*>(smem4);  // [5E], padded to 16 bytes
    float* fin = reinterpret_cast<float*>(tabs + ((5 * E + 1) & ~1));         // [2][rbp]: res, shared of the outputs
    float* ys = fin + 2 * rbp;                                                // [k][rbp]: y_j of the outputs
    void* xs = ys + k * rbp;                                                  // the k staged inputs (XSeg)
    __shared__ int ids_s[MOE_MAX_K];
    __shared__ float wsh[MOE_MAX_K];
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int o0 = blockIdx.x * rb, nrows = min(rb, D - o0);
    const long ro = (long)t * D + o0;
    load_table(tab, E, tabs);
    pdl_wait();
    load_ids(ids + (long)t * k, k, ids_s);
    if (tid < k) wsh[tid] = w[(long)t * k + tid];
    for (int o = tid; o < nrows; o += MOE_NT) {  // the outputs' residual (and shared) rows, for the combine
        if (add) cp_async4(fin + o, res + ro + o, 4);
        if (shared) cp_async4(fin + rbp + o, shared + ro + o, 4);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    // this warp's outputs: unit sets q in [qa, qb) of the block's nsub (outputs o0 + q*MOE_R ..
    // + MOE_R-1), each kh units (q, j), one per held expert (at slot slot(j)): unit u =
    // (q - qa)*kh + j, lane group gi of segment s takes unit s*NG + gi (the last segment's missing
    // units repeat its last: loads the group beside it also makes, results unused)
    const Held hs = held_slots(ids_s, k, lo, hi);
    const int kh = hs.kh;
    auto slot = [&](int q) { return hs.slot(q); };
    constexpr int NG = 32 / MOE_DG;
    const int nsub = (nrows + MOE_R - 1) / MOE_R;
    const int qa = nsub * warp / MOE_NW, qb = nsub * (warp + 1) / MOE_NW, nu = (qb - qa) * kh;
    const int gi = lane / MOE_DG, nck = F / VPC;
    if (kh > 0) {  // the row's ids decide it for the whole block: every warp stages x (barriers) or none
        const UnitCursor last{qa + (nu - 1) / kh, (nu - 1) - ((nu - 1) / kh) * kh};
        UnitCursor fu{qa, 0}, xu{qa, 0}, du{qa, 0};  // this group's unit for the refills, the x, the results
        fu.next(gi, kh);
        xu.next(gi, kh);
        du.next(gi, kh);
        auto live = [&](const UnitCursor& c) { return c.q < last.q || (c.q == last.q && c.j <= last.j); };
        stream_segments<MOE_R, MOE_DG>(
            (nu + NG - 1) / NG, nck,
            [&](RowPlanes (&rp)[MOE_R], const float* (&gp)[MOE_R]) {
                const UnitCursor c = live(fu) ? fu : last;
                const unsigned long long* te = tabs + 5 * ids_s[slot(c.j)];
#pragma unroll
                for (int r = 0; r < MOE_R; ++r) {
                    const long row = min(o0 + c.q * MOE_R + r, D - 1);
                    rp[r] = table_row(te, row, nck);
                    gp[r] = (const float*)te[4] + row;
                }
                fu.next(NG, kh);
            },
            [&]() {
                stage<4>(xs, act + (long)t * k * F, k, F, 0, 1.0f, nullptr, xb16);  // 1 batch up to k F = 512 * MOE_NW
                __syncthreads();
            },
            [&]() {
                const XSeg x = xseg(xs, slot((live(xu) ? xu : last).j), k, F);
                xu.next(NG, kh);
                return x;
            },
            [&](const float (&acc)[MOE_R], const float (&gs)[MOE_R]) {
                float y[MOE_R];
#pragma unroll
                for (int r = 0; r < MOE_R; ++r) y[r] = finish(warp_sum<MOE_DG>(acc[r]), gs[r]);
                if ((lane & (MOE_DG - 1)) == 0 && live(du))
#pragma unroll
                    for (int r = 0; r < MOE_R; ++r) ys[slot(du.j) * rbp + du.q * MOE_R + r] = y[r];
                du.next(NG, kh);
            });
    }
    pdl_trigger();
    __syncwarp();  // the warp's y_j are in: lane i combines its output qa*R + i in ranking order
    // (an expert held elsewhere gives y_j = 0: acc + w_j * 0 = acc, NumpyOps.experts' zeros)
    auto yv = [&](int j, int o) { return hs.has(j) ? ys[j * rbp + o] : 0.0f; };
    for (int o = qa * MOE_R + lane; o < min(qb * MOE_R, nrows); o += 32) {
        float acc = __fmul_rn(wsh[0], yv(0, o));
        for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(wsh[j], yv(j, o)));
        if (shared) acc = __fadd_rn(acc, fin[rbp + o]);
        res[ro + o] = __fadd_rn(add ? fin[o] : 0.0f, acc);
    }
}

extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ w, const float* __restrict__ shared,
                                       float* __restrict__ res, int T, int D, int k, const int* __restrict__ pos,
                                       const int* __restrict__ ids, int lo, int hi, int add) {
    PDL_ENTRY();
    const int t = blockIdx.y, o = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T || o >= D) return;
    auto y = [&](int j) {  // an expert held elsewhere: 0 (its grouped rows were not computed here)
        const long a = (long)t * k + j;
        return ids[a] >= lo && ids[a] < hi ? Y[(pos ? (long)pos[a] : a) * D + o] : 0.0f;
    };
    float acc = __fmul_rn(w[(long)t * k], y(0));
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(w[(long)t * k + j], y(j)));
    if (shared) acc = __fadd_rn(acc, shared[(long)t * D + o]);
    res[(long)t * D + o] = __fadd_rn(add ? res[(long)t * D + o] : 0.0f, acc);
}
