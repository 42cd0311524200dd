// common.cuh — shared helpers for every kernel family (inlined by kernel_build.load_source).
//
// Exactness notes (see ../shared notes and bw24chat/quants.py): where a kernel must reproduce a
// NumPy reference bit for bit, write products and sums with __fmul_rn / __fadd_rn so that the
// compiler cannot contract them into an FMA (NVRTC contracts by default, NumPy never does).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if defined(__CUDACC_RTC__)
// NVRTC has no libc headers: the fixed-width integer types, as <stdint.h> defines them on LP64.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define BW24_DEVICE __device__ __forceinline__

// the sum over each aligned group of G lanes (G = 32: the warp), by the xor tree of offsets G/2 .. 1:
// every lane of the group ends with the same bits
template <int G = 32>
BW24_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

BW24_DEVICE float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

BW24_DEVICE float f16_bits_to_f32(uint16_t b) { return __half2float(__ushort_as_half(b)); }
BW24_DEVICE float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }

// RMSNorm's scale 1 / sqrt(sum_sq / n + eps), each operation rounded on its own (IEEE division
// and square root, as NumpyBackend.rmsnorm): the norm kernels, the fused QK-norm and both matvec
// prologues compute it here, so every path scales a row identically from the same sum.
BW24_DEVICE float rms_inv(float sum_sq, int n, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, (float)n), eps)));
}

// silu(g) = g / (1 + exp(-g)) and sigmoid(g) = 1 / (1 + exp(-g)), each operation rounded on its
// own as numpy_backend.silu / sigmoid compute them (IEEE expf).
BW24_DEVICE float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }
BW24_DEVICE float sigmoid(float g) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))); }

// SwiGLU's activation, silu(g) * u = g / (1 + exp(-g)) * u, each operation rounded on its own as
// NumpyBackend.swiglu computes it (IEEE expf): the prefill (elementwise.cu) and the decode
// matvec (prologue and epilogue) share this one function, so both paths agree bit for bit.
BW24_DEVICE float swiglu_act(float g, float u) { return __fmul_rn(silu(g), u); }

// Programmatic dependent launch (sm_90+; kernel_build launches every kernel but matvec_tc with the
// attribute, the decode graphs only).  pdl_trigger: this grid's dependents may be launched now (their blocks
// start as SMs free up and run until their pdl_wait); pdl_wait: block until every prerequisite
// grid has completed and its memory is visible.  Every kernel calls pdl_wait before it reads
// anything an earlier kernel wrote and before it writes anything; the decode matvecs first issue
// their weight loads (read-only data), so those overlap the previous kernel's tail.  Without the
// launch attribute both are no-ops.  The matvecs trigger when a block's last tile has streamed
// (triggering at entry let several future kernels sit resident and prefetch against the running
// one: measured slower, docs/performance.md); the short kernels trigger at entry (PDL_ENTRY).
BW24_DEVICE void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
BW24_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#define PDL_ENTRY() do { pdl_trigger(); pdl_wait(); } while (0)

// cp.async (sm_80+): 16 / 4 bytes global -> shared, the source bytes past src_bytes zero-filled;
// groups committed and awaited in order (N: how many of the latest groups may still be pending).
BW24_DEVICE uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
BW24_DEVICE void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
BW24_DEVICE void cp_async4(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
// Named barriers (PTX bar.sync / bar.arrive, ids 1..15; 0 is __syncthreads): `count` threads (a
// multiple of 32) complete the barrier; bar.arrive does not wait, and the arriving threads' earlier
// shared-memory writes are visible to the threads that waited on it (the producer / consumer form).
BW24_DEVICE void named_bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
BW24_DEVICE void named_bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory"); }
// Thread-block clusters (sm_90+): a cluster-wide barrier (every thread of every block of the
// cluster arrives; release / acquire order shared-memory writes before it with reads after it,
// cluster-wide), and reads of another block's shared memory (distributed shared memory: mapa
// gives the cluster address of the same variable in block `rank`).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
BW24_DEVICE void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
BW24_DEVICE uint32_t cluster_map(const void* p, uint32_t rank) {
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    return a;
}
BW24_DEVICE float ld_cluster_f32(uint32_t a) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}
#endif
BW24_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
BW24_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// two floats -> packed bf16x2 (round to nearest even), lo in the low half
BW24_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// The bf16-activation contract (opt-in: cuda_runner `activations="bf16"`): every matmul input is
// rounded to the nearest bf16 (ties to even) before the product, on both paths — the prefill
// GEMM's single bf16 x plane and the decode matvec's staging (or its integer-dot quantization
// of that rounded value) — as bf16 engines do (kernel_refs.bf16_round).  The default keeps x
// float32: inputs ~1e-7 apart on the two paths round to neighbouring bf16 values now and then.
BW24_DEVICE float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
BW24_DEVICE float4 bf16_round4(float4 v) { return make_float4(bf16_round(v.x), bf16_round(v.y), bf16_round(v.z), bf16_round(v.w)); }

// four x values -> bf16 hi = bf16(x) and lo = bf16(x - hi) (x - bf16(x) is exact in f32; lo's
// own rounding is the residual error, ~2^-17 relative), each as 4 packed bf16
BW24_DEVICE void split_bf16x4(float4 v, uint2& hi, uint2& lo) {
    const uint32_t h01 = pack_bf16x2(v.x, v.y), h23 = pack_bf16x2(v.z, v.w);
    hi = make_uint2(h01, h23);
    const float x0 = __fsub_rn(v.x, __uint_as_float(h01 << 16)), x1 = __fsub_rn(v.y, __uint_as_float(h01 & 0xFFFF0000u));
    const float x2 = __fsub_rn(v.z, __uint_as_float(h23 << 16)), x3 = __fsub_rn(v.w, __uint_as_float(h23 & 0xFFFF0000u));
    lo = make_uint2(pack_bf16x2(x0, x1), pack_bf16x2(x2, x3));
}

// ---- Activation quantization of the integer-dot linear contract (kernel_refs.act_quant_ref;
// llama.cpp's q8_1 activations, refined to two int8 levels and power-of-two scales).  Per block
// of 32 consecutive inputs of a row: e = max(floor(log2 amax), -100) - 6 (from amax's exponent
// bits, so amax * 2^-e lies in [64, 128)); r = x * 2^-e (exact); h = clamp(floor(r + 1/2), -128,
// 127) (round half up, r + 1/2 in f32), so r - h lies in [-1/2, 1/2) and l = clamp(rint((r - h) *
// 256), -128, 127) (r - h exact; rint half to even) needs no clamp at the half steps: a bf16 input
// (the bf16-activation contract) of at least 2^(e-1) is represented exactly.  (Round-to-even h
// with l clamped to +-127 lost 2^(e-8) on every half step: 18 % of a bf16 row's values, 2e-5 of
// sum |x||w| between prefill and decode; docs/performance.md.)  The quantized
// input is 2^e * (h + l / 256): 15 significant bits, error <= 2^(e-8) (one 256th of a step),
// exact in f32, and its two parts 2^e h and 2^(e-8) l are each exact in bf16.  So the prefill
// GEMM takes them as its two bf16 planes (the precise mode's hi / lo) and the decode matvec as
// two int8 code planes for dp4a — the same numbers on both paths.  Two levels, not one: with
// 8-bit codes a rounding-level difference between the two paths' inputs flips whole steps
// (1/128 of the block maximum), which random models amplified into prefill-vs-decode argmax
// mismatches; the second level makes a flip 256 times smaller (docs/performance.md).
BW24_DEVICE int act_exp(float amax) { return max((int)((__float_as_uint(amax) >> 23) & 0xFFu) - 127, -100) - 6; }
BW24_DEVICE float pow2f(int e) { return __uint_as_float((uint32_t)(127 + e) << 23); }  // -126 <= e <= 127

BW24_DEVICE float clamp_s8(float v) { return fminf(fmaxf(v, -128.0f), 127.0f); }

BW24_DEVICE uint32_t pack_s8x4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xFF) | ((uint32_t)(b & 0xFF) << 8) | ((uint32_t)(c & 0xFF) << 16) | ((uint32_t)d << 24);
}

// An aligned group of 8 lanes holds one block of 32 inputs, lane j of the group inputs 4j..4j+3
// (every lane of the warp calls this: the group reductions are shuffles).  Returns this lane's
// four high codes h packed as int8 bytes in order, their low codes l in *lo; e = the block's
// exponent; sum_h / sum_l = the sums of the h / l codes of the lane's half block (inputs 0-15
// for lanes 0-3, 16-31 for lanes 4-7), exact.
BW24_DEVICE uint32_t act_quant_lane(float4 v, int& e, uint32_t& lo, int& sum_h, int& sum_l) {
    float am = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 4));
    e = act_exp(am);
    const float inv = pow2f(-e);
    const float r[4] = {__fmul_rn(v.x, inv), __fmul_rn(v.y, inv), __fmul_rn(v.z, inv), __fmul_rn(v.w, inv)};
    int h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float hf = clamp_s8(floorf(__fadd_rn(r[j], 0.5f)));
        h[j] = (int)hf;
        l[j] = (int)clamp_s8(rintf(__fmul_rn(__fsub_rn(r[j], hf), 256.0f)));
    }
    int sh = h[0] + h[1] + h[2] + h[3], sl = l[0] + l[1] + l[2] + l[3];
    sh += __shfl_xor_sync(0xffffffffu, sh, 1);
    sh += __shfl_xor_sync(0xffffffffu, sh, 2);
    sl += __shfl_xor_sync(0xffffffffu, sl, 1);
    sl += __shfl_xor_sync(0xffffffffu, sl, 2);
    sum_h = sh;
    sum_l = sl;
    lo = pack_s8x4(l[0], l[1], l[2], l[3]);
    return pack_s8x4(h[0], h[1], h[2], h[3]);
}

// The QX buffer (matvec.cu's contract: an activation row quantized once by its producer, copied
// by the consumer's prologue): per row of n inputs, n/4 words of h codes, n/4 of l codes, then
// n/32 int4 records {e, sum h 0-15, sum h 16-31, (sum l 0-15 & 0xFFFF) | (sum l 16-31) << 16}.
BW24_DEVICE int qx_row_words(int n) { return 5 * n / 8; }

// Quantize one 32-input block b of a QX row (q: the row's first word) from the 8 lanes of an
// aligned lane group (lane j: inputs 4j..4j+3); every lane of the warp calls it (shuffles);
// `store` false: take part in the shuffles only.
BW24_DEVICE void qx_write_block(uint32_t* q, int n, int b, float4 v, bool store) {
    int e, sh, sl;
    uint32_t ql;
    const uint32_t qh = act_quant_lane(v, e, ql, sh, sl);
    const int sh1 = __shfl_xor_sync(0xffffffffu, sh, 4), sl1 = __shfl_xor_sync(0xffffffffu, sl, 4);
    const int j = threadIdx.x & 7;
    if (!store) return;
    q[8 * b + j] = qh;
    q[n / 4 + 8 * b + j] = ql;
    if (j == 0)
        reinterpret_cast<int4*>(q + n / 2)[b] = make_int4(e, sh, sh1, (sl & 0xFFFF) | (int)((uint32_t)sl1 << 16));
}
