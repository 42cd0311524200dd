// moe_group.cu — a prefill chunk's routed experts as grouped GEMMs: the chunk's (token, slot)
// assignments grouped by expert on the device (moe_group), then one launch per projection over
// every expert of the layer (gemm_grouped / gemm_i8_grouped: gate|up with the SwiGLU epilogue,
// then down), whose blocks each take one expert's token tile; moe_experts.cu moe_combine adds a
// row's k outputs in ranking order through the permutation.  Backend: cuda_moe.prefill_experts.
//
// Contract
//   moe_group(ids, n, k, E, bm, offs, toff, tok, pos): ids int32 [n] = the router's ids [T, k]
//     flattened, assignment a = t k + j; grid E blocks of MG_NT threads, E <= MG_EMAX.  Writes
//     offs [E + 1]  exclusive scan of the counts per expert (offs[E] = n): expert e's grouped rows
//                   are [offs[e], offs[e + 1]);
//     toff [E + 1]  the same scan of its token tiles ceil(count / bm) (the grouped GEMMs' blocks);
//     tok [n]       tok[r] = a / k, the token of grouped row r: expert e's assignments in
//                   ascending a (so ascending token) — deterministic, integers only;
//     pos [n]       pos[a] = r, the inverse (moe_combine reads row a's output at Y[pos[a]]).
//     NumPy reference: kernel_refs.moe_group_ref (the stable argsort of ids).
//   gemm_grouped(tab, offs, toff, E, e0, tok, x, xl, out, n_out, n_in, epi): block (bx, by) takes
//     tile y = toff[e0] + by (nothing when y >= toff[E]) of the expert e with toff[e] <= y <
//     toff[e + 1]: grouped rows [r0, r0 + nr), r0 = offs[e] + GG_BM (y - toff[e]), nr <= GG_BM,
//     against weight rows [128 bx, +128) of expert e, read through tab (u64 [E, 5] plane
//     pointers, moe_experts.cu; a null q plane: the expert is not resident, the block does
//     nothing — a spilled layer's other launches compute it).  Row r's input is x row tok[r]
//     (tok given: the gate|up on the chunk's hidden rows) or r (tok null: the down projection on
//     the grouped activations); y = W_e x, gemm_mma.cu's contract and switches (FMT, GEMM_SPLIT,
//     GEMM_XPLANES: x f32 split in the tile load, or its two integer-dot planes x, xl), y[o]
//     times the NVFP4 per-row global scale where tab has one, as gemm_put.
//     epi 0: out[r, o] = y[o], o < n_out.  epi 2 (rows interleaved gate_i, up_i): out[r, i] =
//     swiglu_act(y[2i], y[2i + 1]), i < n_out / 2 (elementwise.cu swiglu_rows' function).
//   gemm_i8_grouped(tab, offs, toff, E, e0, tok, qx, out, n_out, n_in, epi): the same on
//     gemm_i8.cu's contract (FMT = Q8_0; x as QX rows, gemm_act.cu act_quant_qx; n_in a multiple
//     of 64), tiles of GG_BM tokens x 8192 / GG_BM rows.
// Exactness: each output equals, bit for bit, the dense kernel's for that row and that expert's
//   matrix — gemm_mma's (gemm_grouped), gemm_i8_mma's = gemm_i8's (gemm_i8_grouped): the block
//   is theirs (gemm_mma.cuh, gemm_i8_mma.cuh) and no output's arithmetic depends on the tile's
//   token count, its row's place in the tile, the other rows there, or which launch computes it
//   (spilled layers run each streamed expert in a launch of its own: the resident run's bits).
//   MMAs of 16-row slices past nr are skipped (warp-uniform; they would only make zeros).
// Geometry: gemm_grouped 8 warps as 2 x 4, block tile GG_BM x 128, grid (ceil(n_out / 128),
//   tiles); GG_BM (cuda_moe.group_tile) 64 while the mean rows per expert is small (a weight
//   tile read once per expert, the empty half of the tile skipped), else 128.  The grid's tile
//   count is a bound (no host round trip): min(n, (n + min(E, n) (GG_BM - 1)) / GG_BM).
//
// Napkin math (Qwen3-30B-A3B, pp512 = chunks of T = 512: n = 4096 assignments over E = 128
// experts, 32 rows per expert on average; D 2048, F 768; 48 layers):
//   FLOPs per layer: gate|up 2 x 4096 x 1536 x 2048 = 25.8 G, down 2 x 4096 x 2048 x 768 = 12.9
//   G: 38.7 GFLOP, 1.86 TFLOP per chunk (3.6 GFLOP per token).
//   Bytes: every expert is hit by a chunk ((120/128)^512 ~ 0), so all of them are read once:
//   604 M values per layer = Q8_0 (34/32 B) 642 MB, BF16 1208 MB, NVFP4 (9/16 B) 340 MB; per
//   chunk 30.8 / 58.0 / 16.3 GB.  At 3.0 TB/s (H100): 10.3 / 19.3 / 5.4 ms per chunk, i.e. the
//   experts alone bound prefill to 49.8k / 26.5k / 94k tok/s (H200, 4.2 TB/s: 70k / 37k / 131k).
//   Compute (mma.sync assumed at ~2/3 of the H100's ~790 TFLOP/s measured bf16 matmul rate,
//   ~0.5 PFLOP/s bf16, ~1 POPS int8; rows rounded up to 16-row slices: ~1.25x at 32 rows per
//   expert): Q8_0 two int8 MMAs per k32 (the h and l levels) = 3.7 T int8 ops per chunk, ~4.6 ms,
//   plus the fold (~5 issue slots per output and 32-block: 4096 x (1536 x 64 + 2048 x 24) x 5 =
//   3.0 G thread instructions = 94 M warp instructions per layer, ~0.1 ms at 132 SMs x 4 x 1.75
//   GHz, ~6 ms per chunk with the rounding); BF16 and NVFP4 two bf16 MMAs per k16 (x hi, lo) =
//   3.7 TFLOP, ~9 ms, NVFP4 plus its decoding in the tile producer.
//   Bound: Q8_0 and BF16 by their bytes (10.3 / 19.3 ms per chunk on the H100), NVFP4 by compute
//   (~9 ms).  Target: pp512 >= 2 x llama.cpp's 11,290 tok/s (H200) = 22.7 ms per chunk for the
//   whole model.  Launches per layer: moe_group, [x's planes], gate|up, [act's planes], down,
//   combine (4 to 6, against ~7 per active expert before).
#include "gemm_mma.cuh"
#include "gemm_i8_mma.cuh"

#ifndef GG_BM  // tokens per tile of the grouped GEMMs (cuda_moe.group_tile)
#define GG_BM 64
#endif
static_assert(GG_BM == 64 || GG_BM == 128, "64- or 128-token tiles");
#define GG_SMEM_BYTES GM_SMEM_BYTES_FOR(GG_BM)               // gemm_grouped (cuda_linear._gemm_smem)
#define GI_SMEM_BYTES (IM_STAGES * I8Tile<GG_BM / 32>::STAGE)  // gemm_i8_grouped (cuda_linear.gemm_i8_mma_smem)
#define MG_NT 256
#define MG_EMAX 1024  // experts per layer (cuda_moe.router's limit)

// ---------------------------------------------------------------------------------------------
// moe_group.  Every block builds the whole histogram (shared-memory integer atomics: the counts
// do not depend on their order) and scans it; block 0 writes offs / toff; block e then walks the
// ids in order, MG_NT at a time, and ranks its expert's assignments by a block-wide exclusive
// sum: ascending a, whatever the scheduling.

// exclusive prefix sum of v over the block's threads in thread order; total = the block's sum
BW24_DEVICE int block_exclusive_sum(int v, int* wtot, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) wtot[warp] = inc;
    __syncthreads();
    int before = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < MG_NT / 32; ++w) {
        const int s = wtot[w];
        before += w < warp ? s : 0;
        total += s;
    }
    __syncthreads();  // wtot is free again
    return before + inc - v;
}

extern "C" __global__ void __launch_bounds__(MG_NT) moe_group(const int* __restrict__ ids, int n, int k, int E, int bm,
                                                               int* __restrict__ offs, int* __restrict__ toff,
                                                               int* __restrict__ tok, int* __restrict__ pos) {
    __shared__ int cnt[MG_EMAX];
    __shared__ int wtot[MG_NT / 32];
    __shared__ int mine[2];
    PDL_ENTRY();
    const int tid = threadIdx.x, e = blockIdx.x;
    for (int i = tid; i < E; i += MG_NT) cnt[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += MG_NT) {
        const int v = ids[i];
        if ((unsigned)v < (unsigned)E) atomicAdd(&cnt[v], 1);
    }
    __syncthreads();
    constexpr int EPT = MG_EMAX / MG_NT;  // thread tid owns experts [EPT tid, EPT tid + EPT)
    int sc = 0, stl = 0;
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int ex = EPT * tid + q, cq = ex < E ? cnt[ex] : 0;
        sc += cq;
        stl += (cq + bm - 1) / bm;
    }
    int n_all, t_all;
    int oc = block_exclusive_sum(sc, wtot, n_all);
    int ot = block_exclusive_sum(stl, wtot, t_all);
#pragma unroll
    for (int q = 0; q < EPT; ++q) {
        const int ex = EPT * tid + q, cq = ex < E ? cnt[ex] : 0;
        if (ex < E) {
            if (e == 0) {
                offs[ex] = oc;
                toff[ex] = ot;
            }
            if (ex == e) {
                mine[0] = oc;
                mine[1] = cq;
            }
        }
        oc += cq;
        ot += (cq + bm - 1) / bm;
    }
    if (e == 0 && tid == 0) {
        offs[E] = n_all;
        toff[E] = t_all;
    }
    __syncthreads();
    const int base = mine[0], ne = mine[1];
    for (int i0 = 0, done = 0; done < ne; i0 += MG_NT) {  // done: uniform over the block
        const int i = i0 + tid;
        const bool hit = i < n && ids[i] == e;
        int tot;
        const int before = block_exclusive_sum(hit ? 1 : 0, wtot, tot);
        if (hit) {
            const int r = base + done + before;
            tok[r] = i / k;
            pos[i] = r;
        }
        done += tot;
    }
}

// ---------------------------------------------------------------------------------------------
// The grouped GEMMs.

struct GroupTile {
    int e, r0, nr;  // expert, first grouped row, rows (<= GG_BM)
};

// this block's tile (see the contract); false: none
BW24_DEVICE bool group_tile(const int* __restrict__ offs, const int* __restrict__ toff, int E, int e0, GroupTile& gt) {
    const int y = toff[e0] + (int)blockIdx.y;
    if (y >= toff[E]) return false;
    int lo = e0, hi = E;  // toff[lo] <= y < toff[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (toff[mid] <= y) lo = mid;
        else hi = mid;
    }
    gt.e = lo;
    gt.r0 = offs[lo] + (y - toff[lo]) * GG_BM;
    gt.nr = min(GG_BM, offs[lo + 1] - gt.r0);
    return true;
}

// the x row of tile row r: tok[r0 + r] (gathered) or r0 + r; -1 past the tile's rows
BW24_DEVICE long group_row(const int* __restrict__ tok, const GroupTile& gt, int r) {
    if (r >= gt.nr) return -1L;
    return tok ? (long)__ldg(tok + gt.r0 + r) : (long)(gt.r0 + r);
}

// the epilogue: acc of a warp whose tile rows start at wrow and out rows at col0 (mma fragment
// layout: a thread holds the column pairs 2t, 2t + 1 — a gate / up pair under epi 2)
template <int MI>
BW24_DEVICE void group_put(const float (&acc)[MI][4][4], const GroupTile& gt, int wrow, int col0, float* __restrict__ out,
                           const float* __restrict__ gscale, int n_out, int epi) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int hp = 0; hp < 2; ++hp) {
                const int tr = wrow + mi * 16 + g + 8 * hp, col = col0 + ni * 8 + 2 * t4;
                if (tr >= gt.nr || col >= n_out) continue;
                const long row = gt.r0 + tr;
                float v0 = acc[mi][ni][2 * hp], v1 = acc[mi][ni][2 * hp + 1];
                const bool two = col + 1 < n_out;
                if (gscale) {
                    v0 = __fmul_rn(v0, gscale[col]);
                    if (two) v1 = __fmul_rn(v1, gscale[col + 1]);
                }
                if (epi == 2) {
                    if (two) out[row * (n_out / 2) + col / 2] = swiglu_act(v0, v1);
                } else {
                    out[row * n_out + col] = v0;
                    if (two) out[row * n_out + col + 1] = v1;
                }
            }
}

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm_grouped(const unsigned long long* __restrict__ tab, const int* __restrict__ offs, const int* __restrict__ toff, int E,
             int e0, const int* __restrict__ tok, const float* __restrict__ x, const __nv_bfloat16* __restrict__ xl,
             float* __restrict__ out, int n_out, int n_in, int epi) {
    PDL_ENTRY();
    GroupTile gt;
    if (!group_tile(offs, toff, E, e0, gt)) return;
    const unsigned long long* te = tab + 5L * gt.e;
    const uint4* wq = reinterpret_cast<const uint4*>(te[0]);
    if (wq == nullptr) return;  // not resident: a spilled layer's streamed launch computes it
    extern __shared__ float4 smem4[];
    constexpr int MI = GG_BM / 32;
    using St = TileStager<GG_BM, GM_BN>;
    RowTable<St::ACH> rows;
#pragma unroll
    for (int j = 0; j < St::ACH; ++j) rows.v[j] = group_row(tok, gt, St::row_of(j));
    const int warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    const int n0 = blockIdx.x * GM_BN;
    float acc[MI][4][4];
    gemm_mma_tile<MI, true>(acc, wq, reinterpret_cast<const void*>(te[1]), reinterpret_cast<const void*>(te[2]),
                      reinterpret_cast<const void*>(te[3]), x, xl, rows, n_out, n_in, n0, smem4, gt.nr);
    group_put<MI>(acc, gt, wm * 16 * MI, n0 + wn * 32, out, reinterpret_cast<const float*>(te[4]), n_out, epi);
}

extern "C" __global__ void __launch_bounds__(GM_NT)
gemm_i8_grouped(const unsigned long long* __restrict__ tab, const int* __restrict__ offs, const int* __restrict__ toff, int E,
                int e0, const int* __restrict__ tok, const uint32_t* __restrict__ qx, float* __restrict__ out, int n_out,
                int n_in, int epi) {
#if FMT == F_Q8_0
    PDL_ENTRY();
    GroupTile gt;
    if (!group_tile(offs, toff, E, e0, gt)) return;
    const unsigned long long* te = tab + 5L * gt.e;
    const uint8_t* wq = reinterpret_cast<const uint8_t*>(te[0]);
    if (wq == nullptr) return;  // not resident: a spilled layer's streamed launch computes it
    extern __shared__ float4 smem4[];
    using G = I8Tile<GG_BM / 32>;
    RowTable<G::XJ> xrows;
    RowTable<G::RJ> rrows;
#pragma unroll
    for (int j = 0; j < G::XJ; ++j) xrows.v[j] = group_row(tok, gt, G::x_row(j));
#pragma unroll
    for (int j = 0; j < G::RJ; ++j) rrows.v[j] = group_row(tok, gt, G::rec_row(j));
    const int warp = threadIdx.x >> 5, wm = warp / G::WN, wn = warp % G::WN;
    const int n0 = blockIdx.x * G::BN;
    float acc[2][4][4];
    gemm_i8_mma_tile<GG_BM / 32, true>(acc, wq, reinterpret_cast<const uint16_t*>(te[2]), qx, xrows, rrows, n_out, n_in, n0, smem4,
                                 gt.nr);
    group_put<2>(acc, gt, wm * 32, n0 + wn * 32, out, nullptr, n_out, epi);
#else
    (void)tab; (void)offs; (void)toff; (void)E; (void)e0; (void)tok; (void)qx; (void)out; (void)n_out; (void)n_in; (void)epi;
    __trap();  // FMT=Q8_0 only; the wrapper launches it nowhere else
#endif
}
