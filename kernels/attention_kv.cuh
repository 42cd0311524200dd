// attention_kv.cuh — the KV cache types as the attention kernels read them (KV_TYPE: 0 bf16,
// 1 q8_0, 2 fp8, 3 f32; layouts in bw24chat/backends/kernel_refs.py): bf16 uint16 [N, K, HD];
// q8_0 planar int8 [N, K, HD] + f16 scales [N, K, HD/32]; fp8 planar E4M3 [N, K, HD] + f32 scale
// per head vector [N, K]; f32 float32 [N, K, HD], the exact reference cache.  Values = code *
// scale in float32 (f32: the values themselves).
#pragma once
#include "attention_common.cuh"
#include "kv_types.cuh"

#if KV_TYPE == KV_BF16
#define ES 2  // code bytes per value
#define SCB 0  // scale bytes per key row
#elif KV_TYPE == KV_Q8_0
#define ES 1
#define SCB (HD / 16)
#elif KV_TYPE == KV_FP8
#define ES 1
#define SCB 4
#elif KV_TYPE == KV_F32
#define ES 4
#define SCB 0
#else
#error "KV_TYPE must be 0 (bf16), 1 (q8_0), 2 (fp8) or 3 (f32)"
#endif
#define ROWB (HD * ES)
#define KV_SCALED (KV_TYPE == KV_Q8_0 || KV_TYPE == KV_FP8)  // values = code * per-row scale

// ------------------------------------------------------------------ small helpers
// (smem_addr, cp_async16 / cp_async4 / commit / wait: common.cuh)

// 4 E4M3 codes (bytes of x, low first) -> 4 floats / 256 (exact: E4M3 placed in f16 bits; the
// caller folds the 2^8 into the scale).
BW24_DEVICE void e4m3x4_to_f32_div256(uint32_t x, float* o) {
    const uint32_t lo = ((x & 0x00800080u) << 8) | ((x & 0x007F007Fu) << 7);  // bytes 0, 2
    const uint32_t hi = (x & 0x80008000u) | ((x & 0x7F007F00u) >> 1);        // bytes 1, 3
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    o[0] = a.x; o[1] = b.x; o[2] = a.y; o[3] = b.y;
}

// 8 stored values starting at p (16 B of bf16, 8 B of codes or 32 B of f32) -> float32 codes.
BW24_DEVICE void load8(const uint8_t* p, float* o) {
#if KV_TYPE == KV_BF16
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
#elif KV_TYPE == KV_Q8_0
    const uint2 u = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[i] = (float)(int8_t)(u.x >> (8 * i));
        o[4 + i] = (float)(int8_t)(u.y >> (8 * i));
    }
#elif KV_TYPE == KV_FP8
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    e4m3x4_to_f32_div256(u.x, o);
    e4m3x4_to_f32_div256(u.y, o + 4);
#else
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
#endif
}

// The float32 scale that multiplies the codes of dims [d0, d0+8) of a key row whose scale bytes
// start at sp (shared or global).
BW24_DEVICE float row_scale(const uint8_t* sp, int d0) {
#if KV_TYPE == KV_Q8_0
    return __half2float(reinterpret_cast<const __half*>(sp)[d0 / 32]);
#elif KV_TYPE == KV_FP8
    return *reinterpret_cast<const float*>(sp) * 256.0f;
#else
    (void)sp; (void)d0;
    return 1.0f;  // bf16, f32: no scale
#endif
}
