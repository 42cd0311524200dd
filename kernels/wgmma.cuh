// wgmma.cuh — Hopper's warpgroup MMA (sm_90a only: wgmma.mma_async, operands read from shared
// memory through matrix descriptors, or A from registers) for the prefill GEMMs of gemm_wgmma.cu
// and gemm_i8.cu.  WG_AVAILABLE is 0 on every other target (the kernels' bodies compile away).
// Accumulator layout (PTX ISA "Register fragments", wgmma D): warp v of the group holds rows
// 16v..16v+15, element d[4j + 2h + e] = (row 16v + g + 8h, col 8j + 2t + e), g = lane / 4,
// t = lane % 4.
#pragma once
#include "gemm_common.cuh"

#define WG_A_BYTES (GM_BM * GM_BK * 2)  // a 128-row x 64-k bf16 tile
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_AVAILABLE 1
// wgmma m64nNk16 bf16 x bf16 -> f32, D += A.B (scale-d predicate 1, no negation, no transpose:
// both operands K-major).  Inline PTX names every accumulator register: the operand lists below
// (WG_D*: the "%i" names and the "+f" bindings of d[0..63], d[64..127]) serve both widths and
// both forms of A (a shared-memory descriptor, or four registers of bf16 pairs: gemm_wra).
#define WG_D0_63 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "            \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "            \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_D64_127 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "         \
                   "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "         \
                   "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                   "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_F0_63 WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56)
#define WG_F64_127 WG_F8(64), WG_F8(72), WG_F8(80), WG_F8(88), WG_F8(96), WG_F8(104), WG_F8(112), WG_F8(120)

BW24_DEVICE void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_D0_63 "}, %64, %65, p, 1, 1, 0, 0; }"
                 : WG_F0_63
                 : "l"(da), "l"(db), "r"(1));
}

BW24_DEVICE void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_D0_63 ", " WG_D64_127 "}, %128, %129, p, 1, 1, 0, 0; }"
                 : WG_F0_63, WG_F64_127
                 : "l"(da), "l"(db), "r"(1));
}

// the same with A from registers (PTX ISA, "Register fragments", wgmma .m64nNk16 A: warp v of the
// warpgroup holds rows 16v..16v+15 as mma.m16n8k16 does: a[0] = (row g, k 2t..2t+1), a[1] = (row
// g+8, k 2t..), a[2] = (row g, k 2t+8..2t+9), a[3] = (row g+8, k 2t+8..), low half the lower k);
// the registers must hold their values until the wgmma completes (wait_group)
BW24_DEVICE void wgmma_ra_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_D0_63 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0; }"
                 : WG_F0_63
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

BW24_DEVICE void wgmma_ra_m64n256k16(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_D0_63 ", " WG_D64_127 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0; }"
                 : WG_F0_63, WG_F64_127
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// shared memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address >> 4
// (bits 0-13), leading byte offset (unused by swizzled K-major layouts: 1), stride byte offset
// 1024 >> 4 (8-row groups), swizzle mode 1 = 128B (bits 62-63)
BW24_DEVICE uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) | ((uint64_t)1 << 62);
}


// keeps the compiler from moving accumulator accesses across the asynchronous wgmma window
template <int N>
BW24_DEVICE void wg_fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#else
#define WG_AVAILABLE 0
#endif

// the cp.async rings' start (gemm_wgp, gemm_wra): zeroed accumulators, tiles 0 .. STAGES - 3
// requested, one commit group each (empty past nkt, so the group count stays fixed)
template <int STAGES, int N, class Load>
BW24_DEVICE void ring_start(float (&d)[N], Load& load, int nkt) {
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < nkt) load(s, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
}
