// moe_experts.cu — the routed experts of a decode step (m = 1..8 rows), on the resident dense
// layouts of one format (formats.cuh), and the prefill's combine.
//
// Contract (ops.Ops.experts; NumPy reference NumpyOps.experts)
//   Expert storage: per projection a device table tab u64 [E, 5] = the plane pointers {q, h, s,
//   d, gscale} of expert e (0 where the format has no such plane), each the dense resident layout
//   of cuda_weights.repack_host for one expert (gate|up interleaved: rows 2i = gate_i, 2i+1 =
//   up_i).  The kernels read only the table, so a later VRAM / host tier that moves an expert's
//   planes rewrites its row of the table and nothing else (cuda_moe.ExpertStore).
//   moe_gu(tab, x, normw, ids, act, D, F, k, E, pro, xb16, eps): for row t = blockIdx.y, every slot
//     j < k and pair i < F: e = ids[t, j], y = gu_e @ xin[t] (2F rows),
//     act[t, j, i] = swiglu_act(y[2i], y[2i+1]) (common.cuh).  pro 1: xin = (x * inv) * normw,
//     inv = rms_inv(sum of x^2 in the fixed order below) (the deferred rmsnorm); 0: xin = x.
//   moe_down(tab, act, ids, w, shared, res, D, F, k, E, rb, xb16): for row t = blockIdx.y and output
//     o: y_j = down_{ids[t,j]}[o] . act[t, j];  acc = w_0 * y_0;  acc = acc + w_j * y_j, j = 1..k-1
//     (each product rounded: __fmul_rn, no FMA);  acc = acc + shared[t, o] (if shared);
//     res[t, o] = res[t, o] + acc  (in place: the residual stream).  rb: outputs per block.
//   moe_combine(Y, w, shared, res, T, D, k, pos): the prefill's combine, the same order as
//     moe_down, of y_j = Y[pos[t k + j]] (Y [T k, D]: the grouped GEMMs' rows, moe_group.cu; pos
//     null: row t k + j).
//   The activations of every product: xin rounded to bf16 first with xb16 (the bf16-activation
//   contract), then, for the integer-dot formats (ACT_Q8 = kernel_refs.act_q8), quantized per 32
//   inputs by common.cuh act_quant_lane into their exact f32 values 2^e (h + l/256) —
//   kernel_refs.act_quant_ref, what NumpyOps.linear computes for an ActQuantMatrix.  The dot is
//   then the exact decoded weights (formats.cuh decode_exact) times those values in f32 (not yet
//   the dense matvec's dp4a integer dot: the same numbers up to f32 rounding; a faster dot is a
//   later change), times the per-row global scale (NVFP4) on the finished sum.
// Exactness: one warp owns the sum of an output row (y[2i], y[2i+1] for gu, y_j[o] for down):
//   lane L takes the row's chunks L, L+32, ... in order, __fmaf_rn per value from 0, then
//   warp_sum; down's y_j meet in the block's shared memory and one thread per output combines
//   them in ranking order.  The rmsnorm statistic: thread i < 128 sums the squares of inputs 4i..
//   4i+3, 4i+512.. in order (__fadd_rn of __fmul_rn), warp_sum, then the 4 warps in order;
//   staging is per value.  Nothing depends on m, on the grid or on the geometry (MOE_NW, MOE_U,
//   MOE_R, rb), so row t of an m-row step equals the one-row step bit for bit (speculative verify
//   = plain decode), graph or eager, on any GPU.
// Layout: xin staged in shared memory swizzled as matvec.cu's (value e of the chunk lane L reads
//   in warp-tile w at w*WT + (e/4)*128 + 4L + e%4, WT = 32*VPC): each float4 read of a warp is 512
//   contiguous bytes.
// Streaming: a block takes a contiguous share of its row's work, each warp a contiguous share of
//   the block's: SEGMENTS of MOE_R rows of one expert (gu: a gate / up pair, pair by pair through
//   the experts; down: MOE_R of the block's rb outputs, expert by expert).  A segment's round c is
//   the ITEM "chunk L + 32c of each of its rows"; each lane keeps MOE_U items of 16-byte loads in
//   flight (a rolling window that runs on across segments, so a segment's end does not drain the
//   loads), and the first window goes out before the block stages x.  The block copies the whole
//   expert table (E x 40 B) to shared memory (cp.async, issued before its pdl_wait), then reads its
//   row's k ids (and down's weights w): one L2 round trip between the router's ids and the first
//   weight loads.  tuning.MOE_TUNING holds the geometry; the grid fills the GPU's SMs at the
//   wrapper's resident blocks per SM.
//
// Napkin math (Qwen3-30B-A3B: D 2048, F 768, k 8 of E 128, 48 layers; batch 1):
//   weights read per token and layer = k (gu 2F*D + down D*F) = 8 x 3 x 2048 x 768 = 37.7 M
//   values: BF16 75.5 MB, Q8_0 (34/32 B) 40.1 MB, NVFP4 (9/16 B) 21.2 MB; 48 layers: BF16 3.62 GB,
//   Q8_0 1.93 GB, NVFP4 1.02 GB per token, plus the F32 router 1 MB a layer (48 MB).
//   Roofline at 3.0 TB/s (H100): gu / down BF16 16.8 / 8.4 us a layer, Q8_0 8.9 / 4.5 us, NVFP4
//   4.7 / 2.4 us; at 4.2 TB/s (H200) 0.71x.  Per SM (132): Q8_0 gu 202 KB, down 101 KB, streamed
//   at ~23 GB/s each, so ~23 KB must be in flight per SM at ~1 us of loaded latency; 2 blocks of 8
//   warps with MOE_U = 6 items of 2 rows x 16 B per lane hold 96 KB (the old kernels: ~18 KB, and
//   three dependent loads ids -> table -> weights per expert and warp; now ids -> weights once a
//   block).  Work to spread at m = 1: gu 8 x 768 pairs (~23 a block on 264 blocks), down 2048
//   rows x 8 experts (8 rows a block on 256).
//   Arithmetic: the float dot costs ~2 (BF16), ~4 (Q8_0: PRMT, FSUB, FMUL, FMA) and ~6 (NVFP4)
//   instructions per weight, i.e. ~1, ~3.8 and ~10 per byte, against 128 lane instructions per
//   clock of an SM that must take ~13 B per clock: BF16 ~10 %, Q8_0 ~40 % of the issue rate, and
//   NVFP4 all of it: NVFP4 (then Q8_0) is bounded by the dot, not the stream, until the integer
//   dot (matvec_a8.cuh) comes here.
//   x staging: gu stages D floats per block (8 KB, L2), down k*F (24 KB): at m = 1 264 / 256
//   blocks read 2.2 / 6.3 MB of L2 a layer, under the first window's loads.
#include "common.cuh"
#include "formats.cuh"

#ifndef ACT_Q8
#define ACT_Q8 0
#endif
#if ACT_Q8 && IS_FLOAT_FMT
#error "ACT_Q8 is the integer-dot contract of the quantized formats"
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
#ifndef MOE_R  // rows per segment of moe_down (moe_gu's segment is its gate / up pair)
#define MOE_R 2
#endif
#ifndef MOE_MINB  // blocks per SM the register budget must allow
#define MOE_MINB 2
#endif
#define MOE_NT (MOE_NW * 32)
#define STAT_NT 128   // threads of the rmsnorm statistic (its order: the header)
#define MOE_MAX_K 32  // experts per row (moe_router's limit)
#define WT (32 * VPC)

// swizzled shared position of natural input i (i % 4 == 0: the float4 of inputs i..i+3)
BW24_DEVICE int swz(int i) {
    const int kc = i / VPC, e = i % VPC;
    return (kc >> 5) * WT + (e >> 2) * 128 + 4 * (kc & 31) + (e & 3);
}

BW24_DEVICE int padded(int n) { return (n + WT - 1) / WT * WT; }

// xin of n inputs (segments of seg inputs, each staged at a multiple of padded(seg)) into xs:
// scaled by inv * normw (pro 1), rounded to bf16 (xb16), quantized per 32 (ACT_Q8).  Whole
// warps run it (act_quant_lane's shuffles); n, seg multiples of 32 with ACT_Q8, of 4 without.
BW24_DEVICE void stage(float* xs, const float* __restrict__ x, int n, int seg, int pro, float inv,
                       const float* __restrict__ normw, int xb16) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sp = padded(seg);
    for (int base = warp * 128; base < n; base += MOE_NW * 128) {
        const int i = base + 4 * lane;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n) {
            v = *reinterpret_cast<const float4*>(x + i);
            if (pro == 1) {
                const float4 g = *reinterpret_cast<const float4*>(normw + i);
                v = make_float4(__fmul_rn(__fmul_rn(v.x, inv), g.x), __fmul_rn(__fmul_rn(v.y, inv), g.y),
                                __fmul_rn(__fmul_rn(v.z, inv), g.z), __fmul_rn(__fmul_rn(v.w, inv), g.w));
            }
            if (xb16) v = bf16_round4(v);
        }
#if ACT_Q8
        int e, sh, sl;
        uint32_t ql;
        const uint32_t qh = act_quant_lane(v, e, ql, sh, sl);
        const float s1 = pow2f(e), s2 = pow2f(e - 8);
        float q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[j] = __fadd_rn(__fmul_rn((float)(int)(int8_t)byte_of(qh, j), s1), __fmul_rn((float)(int)(int8_t)byte_of(ql, j), s2));
        v = make_float4(q[0], q[1], q[2], q[3]);
#endif
        if (i < n) {
            const int sg = i / seg;
            *reinterpret_cast<float4*>(xs + sg * sp + swz(i - sg * seg)) = v;
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

// The ids of row t's k experts (and, for down, their weights) into shared memory, by the threads
// from `first` on (the others are computing the rmsnorm statistic meanwhile)
BW24_DEVICE void load_ids(const int* __restrict__ idt, int k, int* ids_s, int first) {
    const int j = (int)threadIdx.x - first;
    if (j >= 0 && j < k) ids_s[j] = idt[j];
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

// One item's products: chunk kc of R rows (c) against the staged x (xb: the segment's base),
// value by value in natural order, into acc (the 32-value formats half a chunk at a time: the
// same operations in the same order, half the decoded values and x live)
template <int R>
BW24_DEVICE void item_dot(const Raw (&c)[R], int kc, const float* xb, float (&acc)[R]) {
    const float* xw = xb + (kc >> 5) * WT + 4 * (threadIdx.x & 31);
#if VPC == 32 && !IS_FLOAT_FMT
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
            for (int e = 0; e < 16; ++e) acc[r] = __fmaf_rn(v[e], xv[e], acc[r]);
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
        for (int e = 0; e < VPC; ++e) acc[r] = __fmaf_rn(v[e], xv[e], acc[r]);
    }
#endif
}

// One warp's stream of nseg segments of R rows, nr = ceil(nck / 32) items each (the header).
//   rows(s, rp, gp): the planes of segment s's rows and (NVFP4) their global-scale pointers;
//   prologue(): the block's x staging, run by every warp once its first window is out (barriers);
//   xbase(s): segment s's staged x;  done(s, acc, gs): segment s's lane sums and row scales.
// Items are consumed in order; slot u of the window is refilled with the item MOE_U further on
// (the next segment's, past this one's end) as soon as it is consumed.
template <int R, class Rows, class Prologue, class XBase, class Done>
BW24_DEVICE void stream_segments(int nseg, int nck, Rows rows, Prologue prologue, XBase xbase, Done done) {
    const int lane = threadIdx.x & 31, nr = (nck + 31) >> 5, n = nseg * nr;
    Raw win[MOE_U][R];
    float wgs[MOE_U][R];
    RowPlanes rp[R];
    const float* gp[R];
    int fs = 0, fc = 0;  // the refill cursor: segment, round
    if (nseg > 0) rows(0, rp, gp);
    auto refill = [&](int u) {
        if (fs >= nseg) return;
        const int kc = lane + 32 * fc;
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
            if (++fs < nseg) rows(fs, rp, gp);
        }
    };
#pragma unroll
    for (int u = 0; u < MOE_U; ++u) refill(u);
    prologue();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int cs = 0, cc = 0;  // the consume cursor
    const float* xb = nseg > 0 ? xbase(0) : nullptr;
    for (int i0 = 0; i0 < n; i0 += MOE_U) {
#pragma unroll
        for (int u = 0; u < MOE_U; ++u) {
            if (i0 + u < n) {
                Raw cur[R];
                float g[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    cur[r] = win[u][r];
                    g[r] = wgs[u][r];
                }
                refill(u);
                const int kc = lane + 32 * cc;
                if (kc < nck) item_dot<R>(cur, kc, xb, acc);
                if (++cc == nr) {
                    done(cs, acc, g);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
                    cc = 0;
                    if (++cs < nseg) xb = xbase(cs);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_NT, MOE_MINB)
moe_gu(const unsigned long long* __restrict__ tab, const float* __restrict__ x, const float* __restrict__ normw,
       const int* __restrict__ ids, float* __restrict__ act, int D, int F, int k, int E, int pro, int xb16, float eps) {
    extern __shared__ float4 smem4[];
    unsigned long long* tabs = reinterpret_cast<unsigned long long*>(smem4);  // [5E], padded to 16 bytes
    float* xs = reinterpret_cast<float*>(tabs + ((5 * E + 1) & ~1));          // [padded(D)], swizzled
    __shared__ int ids_s[MOE_MAX_K];
    __shared__ float red[STAT_NT / 32];
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* xt = x + (long)t * D;
    const int* idt = ids + (long)t * k;
    load_table(tab, E, tabs);
    pdl_wait();
    load_ids(idt, k, ids_s, MOE_NW > 4 ? STAT_NT : 0);
    if (pro == 1 && tid < STAT_NT) {  // the rmsnorm statistic (the header's order)
        float ss = 0.0f;
        for (int i = 4 * tid; i < D; i += 4 * STAT_NT) {
            const float4 v = *reinterpret_cast<const float4*>(xt + i);
            ss = __fadd_rn(ss, __fmul_rn(v.x, v.x));
            ss = __fadd_rn(ss, __fmul_rn(v.y, v.y));
            ss = __fadd_rn(ss, __fmul_rn(v.z, v.z));
            ss = __fadd_rn(ss, __fmul_rn(v.w, v.w));
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
    }
    cp_async_wait<0>();
    __syncthreads();
    float inv = 1.0f;
    if (pro == 1) {
        float tot = red[0];
        for (int w = 1; w < STAT_NT / 32; ++w) tot = __fadd_rn(tot, red[w]);
        inv = rms_inv(tot, D, eps);
    }
    // this warp's pairs tau in [a, b) of the row's k*F (tau = j*F + i: rows 2i, 2i+1 of expert ids[t, j])
    const long N = (long)k * F;
    const long b0 = N * blockIdx.x / gridDim.x, nb = N * (blockIdx.x + 1) / gridDim.x - b0;
    const int a = (int)(b0 + nb * warp / MOE_NW), b = (int)(b0 + nb * (warp + 1) / MOE_NW);
    const int nck = D / VPC;
    stream_segments<2>(
        b - a, nck,
        [&](int s, RowPlanes (&rp)[2], const float* (&gp)[2]) {
            const int tau = a + s, j = tau / F, i = tau - j * F;
            const unsigned long long* te = tabs + 5 * ids_s[j];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                rp[r] = table_row(te, 2L * i + r, nck);
                gp[r] = (const float*)te[4] + 2L * i + r;
            }
        },
        [&]() {
            stage(xs, xt, D, D, pro, inv, normw, xb16);
            __syncthreads();
        },
        [&](int) { return (const float*)xs; },
        [&](int s, const float (&acc)[2], const float (&gs)[2]) {
            const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
            if (lane == 0) {
                const int tau = a + s, j = tau / F, i = tau - j * F;
                act[((long)t * k + j) * F + i] = swiglu_act(finish(g, gs[0]), finish(u, gs[1]));
            }
        });
    pdl_trigger();  // this warp's weight stream is done: the next kernel may start
}

extern "C" __global__ void __launch_bounds__(MOE_NT, MOE_MINB)
moe_down(const unsigned long long* __restrict__ tab, const float* __restrict__ act, const int* __restrict__ ids,
         const float* __restrict__ w, const float* __restrict__ shared, float* __restrict__ res, int D, int F, int k, int E,
         int rb, int xb16) {
    extern __shared__ float4 smem4[];
    const int fp = padded(F);
    unsigned long long* tabs = reinterpret_cast<unsigned long long*>(smem4);  // [5E], padded to 16 bytes
    float* xs = reinterpret_cast<float*>(tabs + ((5 * E + 1) & ~1));          // [k][fp], each segment swizzled
    float* ys = xs + k * fp;                                                  // [k][rb]: y_j of the block's outputs
    __shared__ int ids_s[MOE_MAX_K];
    __shared__ float wsh[MOE_MAX_K];
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int o0 = blockIdx.x * rb, nrows = min(rb, D - o0);
    load_table(tab, E, tabs);
    pdl_wait();
    load_ids(ids + (long)t * k, k, ids_s, 0);
    if (tid < k) wsh[tid] = w[(long)t * k + tid];
    cp_async_wait<0>();
    __syncthreads();
    // this warp's segments sg in [a, b) of the block's k * nsub (sg = j*nsub + q: outputs
    // o0 + q*MOE_R .. + MOE_R-1 of expert ids[t, j])
    const int nsub = (nrows + MOE_R - 1) / MOE_R, S = k * nsub;
    const int a = S * warp / MOE_NW, b = S * (warp + 1) / MOE_NW;
    const int nck = F / VPC;
    stream_segments<MOE_R>(
        b - a, nck,
        [&](int s, RowPlanes (&rp)[MOE_R], const float* (&gp)[MOE_R]) {
            const int sg = a + s, j = sg / nsub, q = sg - j * nsub;
            const unsigned long long* te = tabs + 5 * ids_s[j];
#pragma unroll
            for (int r = 0; r < MOE_R; ++r) {
                const long row = min(o0 + q * MOE_R + r, D - 1);
                rp[r] = table_row(te, row, nck);
                gp[r] = (const float*)te[4] + row;
            }
        },
        [&]() {
            stage(xs, act + (long)t * k * F, k * F, F, 0, 1.0f, nullptr, xb16);
            __syncthreads();
        },
        [&](int s) { return (const float*)xs + ((a + s) / nsub) * fp; },
        [&](int s, const float (&acc)[MOE_R], const float (&gs)[MOE_R]) {
            const int sg = a + s, j = sg / nsub, q = sg - j * nsub;
#pragma unroll
            for (int r = 0; r < MOE_R; ++r) {
                const float y = warp_sum(acc[r]);
                if (lane == 0 && q * MOE_R + r < nrows) ys[j * rb + q * MOE_R + r] = finish(y, gs[r]);
            }
        });
    pdl_trigger();
    __syncthreads();
    for (int o = tid; o < nrows; o += MOE_NT) {  // y_j combined in ranking order
        float acc = __fmul_rn(wsh[0], ys[o]);
        for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(wsh[j], ys[j * rb + o]));
        const long ro = (long)t * D + o0 + o;
        if (shared) acc = __fadd_rn(acc, shared[ro]);
        res[ro] = __fadd_rn(res[ro], acc);
    }
}

extern "C" __global__ void moe_combine(const float* __restrict__ Y, const float* __restrict__ w, const float* __restrict__ shared,
                                       float* __restrict__ res, int T, int D, int k, const int* __restrict__ pos) {
    PDL_ENTRY();
    const int t = blockIdx.y, o = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T || o >= D) return;
    auto y = [&](int j) { const long a = (long)t * k + j; return Y[(pos ? (long)pos[a] : a) * D + o]; };
    float acc = __fmul_rn(w[(long)t * k], y(0));
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(w[(long)t * k + j], y(j)));
    if (shared) acc = __fadd_rn(acc, shared[(long)t * D + o]);
    res[(long)t * D + o] = __fadd_rn(res[(long)t * D + o], acc);
}
