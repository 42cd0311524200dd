// attention_common.cuh — what the three attention kernels share (attention_decode.cu,
// attention_decode_tc.cu, attention_prefill.cu): the head geometry, the log2-domain -inf, and the
// bf16 tensor-core helpers (mma.sync m16n8k16, f32 accumulators).
//
// Shape legend: m decode rows (1..8, consecutive positions), T prefill tokens, H query heads,
// K kv heads, G = H/K group size, GQ query heads handled together by one block (a divisor of G),
// NSG = G/GQ, HD head dim, N cache positions (n_ctx), L_r keys attended by decode row r.
// Layouts: q float32 [rows, H, HD]; out float32 [rows, H, HD] (= [rows, H*HD]); the caches:
//   attention_kv.cuh.  Scores are kept in the log2 domain: s = (q . k) * scale * log2(e),
//   p = exp2(s - max).
// Paged caches (KV_PAGE > 0, the batched step's pool: bw24chat/kv_pages.py, backends/cuda_batch.py):
//   the cache holds blocks of KV_PAGE positions; a sequence's block table (int32, one entry per
//   block, position order) says which: position p lives in cache row table[p / KV_PAGE] * KV_PAGE
//   + p % KV_PAGE.  Key tiles never straddle a block (KV_PAGE is a multiple of every kernel's
//   tile), so a tile's rows are contiguous as in the plain cache; only the tile's first row is
//   looked up.  The arithmetic and its order are the plain cache's: a row's bits are the same
//   whether its keys are paged or contiguous (kernel_refs.paged_rows states the mapping).
// Defines: HD (head dim), GQ (heads per block; decode <= 8), KV_PAGE (0: contiguous cache rows).
#pragma once
#include "common.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef GQ
#define GQ 4
#endif
static_assert(GQ >= 1, "GQ");

#ifndef KV_PAGE
#define KV_PAGE 0
#endif

#define NEG_INF (-__int_as_float(0x7f800000))

// The cache row of position key0, the first key of a tile (KV_PAGE: through the sequence's block
// table; the tile's other keys follow it in the same block).
BW24_DEVICE long long kv_tile_row(const int* __restrict__ table, int key0) {
#if KV_PAGE
    return (long long)table[key0 / KV_PAGE] * KV_PAGE + key0 % KV_PAGE;
#else
    (void)table;
    return key0;
#endif
}
#define LDK (HD + 8)  // bf16 elements per shared K / V row: the 16 B pad keeps ldmatrix / LDS conflict-free

BW24_DEVICE uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// (x, y) -> packed bf16 hi = bf16(x, y) and lo = bf16((x, y) - hi): x ~= hi + lo to 2^-17.
BW24_DEVICE void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = pack_bf16(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
}

BW24_DEVICE void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

BW24_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

