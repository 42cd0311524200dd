// matvec_a8.cuh — the integer-dot path of matvec.cu (ACT_Q8 = 1, the quantized formats): x's
// prologue quantized into two int8 code levels per 32-input block and staged in shared memory
// (stage_a8, or stage_qx from a QX buffer) through a sink (dot_a8.cuh: A8Planes, the layout of
// dot_a8.cuh's chunk products), and qx_out's tiles (qx_write_tile).  Contract and exactness:
// matvec.cu's header; NumPy reference: kernel_refs.matvec_ref with act_quant_ref.  Included after
// the geometry (matvec_common.cuh: MV_M, MV_NT, STAT_NT; MV_MINB) by matvec.cu and by
// matvec_mma.cu, which stages x by the same code into planes of its own layout (its sink).
#pragma once
#include "dot_a8.cuh"

// Prologue 3 (qx): the MV_M tokens' words and records of the n_in inputs from input 32 b0 of QX
// rows of n_row inputs (layout: contract at the top; matvec.cu stages whole rows, b0 = 0, n_in =
// n_row; matvec_mma.cu one K range of them: a block's codes and record are its own), staged as a
// row of n_in inputs; one 32-input block per thread and pass: its 2 x 32 code bytes and record are
// one L2 round trip, written to the staged positions (a8_word: 32-value chunks keep inputs 0-15 of
// chunk kc at words 4kc.., 16-31 at 4(nck+kc)..; Q8_0's 16-value chunks are in natural order).
template <class Sink>
BW24_DEVICE void stage_qx(const uint32_t* __restrict__ qx, int n_row, int b0, int n_in, const Sink& sink) {
    const int nck = n_in / VPC, wpm = n_row / 4, nb = n_in / 32;
    for (int m = 0; m < MV_M; ++m) {
        const uint32_t* q = qx + (long)m * qx_row_words(n_row);
        const uint4* q4 = reinterpret_cast<const uint4*>(q);
        const int4* rec = reinterpret_cast<const int4*>(q + n_row / 2);
        uint32_t* xwm = sink.codes(m);
        auto* metam = sink.recs(m);
        for (int b = threadIdx.x; b < nb; b += MV_NT) {
            const int bq = b0 + b;
            const uint4 h0 = q4[2 * bq], h1 = q4[2 * bq + 1];
            const uint4 l0 = q4[wpm / 4 + 2 * bq], l1 = q4[wpm / 4 + 2 * bq + 1];
            const int4 r = rec[bq];
            uint4* dst = reinterpret_cast<uint4*>(xwm);
            dst[a8_word(32 * b, nck) / 4] = h0;
            dst[a8_word(32 * b + 16, nck) / 4] = h1;
            dst[(sink.lstride + a8_word(32 * b, nck)) / 4] = l0;
            dst[(sink.lstride + a8_word(32 * b + 16, nck)) / 4] = l1;
            sink.record(metam, b, r.x, r.y, r.z, (int)(short)(r.w & 0xFFFF), r.w >> 16);
        }
    }
}

// The integer-dot prologue of the MV_M tokens: xin (prologue applied) quantized per 32-block into
// the two planes' words and records (through the sink: token m's at sink.codes(m), sink.recs(m)).  Thread tid takes the
// float4 groups f = b0 + tid + MV_NT*i (i < A8_NR) of each batch b0, all its loads issued before
// any use, so a row of up to MV_NT*A8_NR*4 = 4096 inputs costs one round trip to L2 and, with
// rmsnorm, stays in registers between the statistic and the staging: where one batch of the
// statistic's loads holds the whole row (n_in / 4 <= STAT_NT * A8_NR: qkv, gate|up and the LM
// head of 4096-input models) the norm weights come in that batch too and the statistic's threads
// stage exactly the groups they hold (under MV_STAT8 the other 8 warps stage nothing), one L2
// round trip in all (decode +0.3-4 %, docs/performance.md).  The rmsnorm statistic: each thread's
// squares in the order (b0, i, x, y, z, w) by FMA, warp_sum, then the STAT_NW warps in order —
// the same for every MV_M.  Every thread runs the same trip count (the group reductions are
// shuffles).  red: MV_NW floats.  (Copying the row to shared memory by cp.async measured slower.)
#define A8_NR (MV_MINB >= 3 ? 2 : 4)  // float4 groups per thread and batch (4 spills at 80 registers)
template <class Sink>
BW24_DEVICE void stage_a8(const float* __restrict__ x, int ldx, int n_in, int pro, float eps,
                          const float* __restrict__ normw, bool xb16, const Sink& sink, float* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n4 = n_in / 4, nck = n_in / VPC;
    const float4* w4 = reinterpret_cast<const float4*>(normw);
    const bool cached = pro == PRO_RMS && n4 <= STAT_NT * A8_NR;  // the statistic's loads serve the staging
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int m = 0; m < MV_M; ++m) {
        const float4* x4 = reinterpret_cast<const float4*>(x + (long)m * ldx);
        uint32_t* xwm = sink.codes(m);
        auto* metam = sink.recs(m);
        float4 v[A8_NR];
        float4 wc[A8_NR];  // the norm weights of the groups in v (cached)
        float inv = 1.0f;
        if (pro == PRO_RMS) {
            float ss = 0.0f;
            for (int b0 = 0; b0 < n4 && (!MV_STAT8 || tid < STAT_NT); b0 += STAT_NT * A8_NR) {
#pragma unroll
                for (int i = 0; i < A8_NR; ++i) {
                    const int f = b0 + tid + STAT_NT * i;
                    v[i] = f < n4 ? x4[f] : zero;
                    if (cached) wc[i] = f < n4 ? __ldg(w4 + f) : zero;
                }
                ss = add_squares(v, ss);
            }
            ss = warp_sum(ss);
            if (lane == 0) red[warp] = ss;
            __syncthreads();
            float s = red[0];
#pragma unroll
            for (int w = 1; w < STAT_NW; ++w) s = __fadd_rn(s, red[w]);
            inv = rms_inv(s, n_in, eps);
            __syncthreads();  // red[] is the next token's
        }
        // group f (a = x, w = the prologue's second operand) -> xin -> the two code planes and records
        auto stage = [&](int f, float4 a, float4 w) {
            const bool ok = f < n4;
            if (pro == PRO_RMS)
                a = make_float4(rms_apply(a.x, inv, w.x), rms_apply(a.y, inv, w.y), rms_apply(a.z, inv, w.z), rms_apply(a.w, inv, w.w));
            else if (pro == PRO_SWIGLU)
                a = make_float4(swiglu_act(a.x, w.x), swiglu_act(a.y, w.y), swiglu_act(a.z, w.z), swiglu_act(a.w, w.w));
            if (!ok) a = zero;
            if (xb16) a = bf16_round4(a);
            a8_stage_group(f, a, ok, xwm, metam, nck, sink);
        };
        if (cached) {  // one batch held the row: its threads stage their own groups (whole warps: shuffles)
            if (tid < STAT_NT)
#pragma unroll
                for (int i = 0; i < A8_NR; ++i) stage(tid + STAT_NT * i, v[i], wc[i]);
            continue;
        }
        for (int b0 = 0; b0 < n4; b0 += MV_NT * A8_NR) {
            float4 wv[A8_NR];
#pragma unroll
            for (int i = 0; i < A8_NR; ++i) {
                const int f = b0 + tid + MV_NT * i;
                const bool ok = f < n4;
                if (!cached) v[i] = ok ? x4[f] : zero;
                wv[i] = pro == PRO_RMS && ok ? __ldg(w4 + f) : zero;  // the prologue's second operand:
                if (pro == PRO_SWIGLU) wv[i] = ok ? x4[n4 + f] : zero;  // the norm weights, or swiglu's up half
            }
#pragma unroll
            for (int i = 0; i < A8_NR; ++i) stage(b0 + tid + MV_NT * i, v[i], wv[i]);
        }
    }
}

// qx_out's block b (matvec.cu's contract) of the MV_M tokens from one tile's 32 outputs per token
// (qxb: [MV_M][32] floats), by one warp: lane group lane / 8 quantizes token m0 + lane / 8
BW24_DEVICE void qx_write_tile(uint32_t* __restrict__ qx_out, int nq, int b, const float* qxb) {
    const int lane = threadIdx.x & 31;
    for (int m0 = 0; m0 < MV_M; m0 += 4) {
        const int m = m0 + (lane >> 3);
        const float4 v = m < MV_M ? reinterpret_cast<const float4*>(qxb + m * 32)[lane & 7] : make_float4(0.f, 0.f, 0.f, 0.f);
        qx_write_block(qx_out + (long)min(m, MV_M - 1) * qx_row_words(nq), nq, b, v, m < MV_M);
    }
}
