// gemm_act.cu — x prepared once per prefill GEMM, for every GEMM kernel: split_bf16 (x as bf16
// hi / lo planes), act_quant (the integer-dot contract's two code levels as bf16 planes) and
// act_quant_qx (the same codes as QX rows for gemm_i8.cu).  Elementwise passes: HBM-bound, one
// read of x (4 bytes per value) and one write of 2-4 bytes per value and plane.  NumPy
// references: kernel_refs.act_quant_ref, qx_ref; GPU test: tests/gpu/test_gemm.py.
#include "common.cuh"

// split_bf16: hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i]) (lo only when lo != null), i < n —
// the TileStager's conversion, done once per GEMM instead of once per block
extern "C" __global__ void split_bf16(const float4* __restrict__ x, uint2* __restrict__ hi, uint2* __restrict__ lo, long n4) {
    PDL_ENTRY();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        uint2 h, l;
        split_bf16x4(x[i], h, l);
        hi[i] = h;
        if (lo) lo[i] = l;
    }
}


// act_quant: the integer-dot contract's activation quantization of x (f32 [n], n a multiple of
// 32: rows of a multiple of 32 inputs) per 32-block, exactly as the decode matvec's staging
// (common.cuh act_quant_lane): the two parts 2^e h and 2^(e-8) l as bf16 planes (xq_hi, xq_lo:
// every prefill GEMM's x hi / lo operands, each exact; xq_lo may be null: the high level
// alone, as split_bf16's lo).  Every lane of a warp runs the same trip count (group reductions are shuffles).
BW24_DEVICE float code_byte(uint32_t w, int j) { return (float)(int)(int8_t)((w >> (8 * j)) & 0xFFu); }

extern "C" __global__ void act_quant(const float4* __restrict__ x, uint2* __restrict__ xq_hi, uint2* __restrict__ xq_lo, long n4) {
    PDL_ENTRY();
    for (long f0 = (long)blockIdx.x * blockDim.x; f0 < n4; f0 += (long)gridDim.x * blockDim.x) {
        const long f = f0 + threadIdx.x;
        const bool ok = f < n4;
        const float4 v = ok ? x[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int e, sh, sl;
        uint32_t ql;
        const uint32_t qh = act_quant_lane(v, e, ql, sh, sl);
        if (!ok) continue;
        const float sc = pow2f(e), sc_lo = pow2f(e - 8);
        float hi[4], lo[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            hi[j] = __fmul_rn(code_byte(qh, j), sc);
            lo[j] = __fmul_rn(code_byte(ql, j), sc_lo);
        }
        xq_hi[f] = make_uint2(pack_bf16x2(hi[0], hi[1]), pack_bf16x2(hi[2], hi[3]));
        if (xq_lo) xq_lo[f] = make_uint2(pack_bf16x2(lo[0], lo[1]), pack_bf16x2(lo[2], lo[3]));
    }
}

// act_quant_qx: x (f32 [T, n], n a multiple of 32) -> QX rows [T, qx_row_words(n)] (common.cuh:
// the codes and records the decode matvec's prologue would build; kernel_refs.qx_ref), for
// gemm_i8.  An aligned group of 8 lanes takes one 32-block (n / 4 float4 per row: a multiple of 8).
// xb16: x rounded to bf16 first (the bf16-activation contract, as the matvec's PRO_BF16).
extern "C" __global__ void act_quant_qx(const float4* __restrict__ x, uint32_t* __restrict__ qx, int n, long n4, int xb16) {
    PDL_ENTRY();
    for (long f0 = (long)blockIdx.x * blockDim.x; f0 < n4; f0 += (long)gridDim.x * blockDim.x) {
        const long f = f0 + threadIdx.x;
        const bool ok = f < n4;
        float4 v = ok ? x[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (xb16) v = bf16_round4(v);
        const long t = ok ? f / (n / 4) : 0;
        const int b = ok ? (int)((f - t * (n / 4)) >> 3) : 0;
        qx_write_block(qx + t * qx_row_words(n), n, b, v, ok);
    }
}
