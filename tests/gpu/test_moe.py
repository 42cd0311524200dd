"""MoE on the GPU (kernels/moe_router.cu, moe_experts.cu, backends/cuda_moe.py) against the NumPy
reference (numpy_backend.route_logits, NumpyOps.experts): router ids and weights bit for bit on
fresh random logits (ties included), the decode experts to f32 rounding (BF16 with f32
activations; the integer-dot formats under their contract on both sides) in every format, odd
sizes included, m-row invariance bit for bit, one Qwen3-30B-A3B-shaped layer, and whole tiny models (greedy tokens vs the NumPy runner;
prefill argmax = decode argmax), and the grouped prefill (moe_group.cu) against the per-expert GEMMs
bit for bit."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.ops import RouterSpec

ROUTERS = [  # (E, spec) : the families' rules, E = 8 .. 256
    (8, RouterSpec(8, 3, "softmax", True)),
    (64, RouterSpec(64, 8, "softmax", False)),
    (128, RouterSpec(128, 8, "softmax", True)),  # Qwen3-30B-A3B
    (160, RouterSpec(160, 8, "sigmoid", True, 1, 1, 2.5)),  # GLM-4.5
    (128, RouterSpec(128, 8, "sigmoid", True, 1, 1, 1.0)),  # GLM-4.5-Air
    (256, RouterSpec(256, 8, "sigmoid", True, 1, 1, 1.0)),  # MiniMax-M2
    (256, RouterSpec(256, 8, "sigmoid", True, 8, 4, 2.5)),  # DeepSeek-V3 groups
    (8, RouterSpec(8, 3, "sigmoid", True, 4, 2, 2.5)),  # tiny glm4_moe
]


@pytest.mark.parametrize("E,spec", ROUTERS)
def test_moe_router(cp, rng, E, spec):
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.numpy_backend import route_logits

    T = 40
    logits = rng.standard_normal((T, E)).astype(np.float32) * 2
    logits[:10] = np.round(logits[:10])  # many exact ties
    logits[10:14] = 0.5  # all equal
    bias = (rng.standard_normal(E).astype(np.float32) * 0.01) if spec.scoring == "sigmoid" else None
    bias_d = None if bias is None else cp.asarray(bias)
    ids, w = cp.zeros((T, spec.top_k), cp.int32), cp.zeros((T, spec.top_k), cp.float32)
    cuda_moe.router(cp.asarray(logits), bias_d, ids, w, T, spec)
    ref_ids, ref_w = route_logits(logits, spec, bias)
    np.testing.assert_array_equal(ids.get(), ref_ids)
    np.testing.assert_array_equal(w.get().view(np.uint32), ref_w.view(np.uint32))


def _experts(fmt, E, F, D, rng):
    from bw24chat.loaders.tensor import ExpertTensor
    from bw24chat.synthetic import random_experts

    return [ExpertTensor(n, random_experts(fmt, E, r, c, rng)) for n, r, c in (("g", F, D), ("u", F, D), ("d", D, F))]


# (format, E, F, D, k): every format's decoder and dot; one Qwen3-30B-A3B layer (F / VPC = 24 or 48
# chunks: moe_down's 8-lane units whole); odd sizes: F / VPC not a multiple of 8 (idle lanes in a
# unit's last round: Q8_0 F 96 and 224, Q4_0 160, F16 104), k not a multiple of the 4 units of a
# warp's segment (3, 5, 6: segments straddle outputs), E odd
SHAPES = [("BF16", 8, 96, 256, 3), ("Q8_0", 8, 96, 256, 3), ("NVFP4", 8, 64, 256, 3),
          ("BF16", 128, 768, 2048, 8), ("Q8_0", 128, 768, 2048, 8), ("NVFP4", 128, 768, 2048, 8),  # one Qwen3-30B-A3B layer
          ("MXFP4", 8, 96, 256, 3), ("MXFP4", 128, 768, 2048, 8), ("Q2_K", 8, 256, 256, 3), ("Q3_K", 8, 256, 256, 3),
          ("Q4_K", 9, 256, 512, 5), ("Q5_K", 9, 256, 512, 5), ("Q6_K", 9, 256, 512, 5), ("Q4_K", 128, 768, 2048, 8),
          ("Q8_0", 11, 224, 352, 6), ("Q4_0", 7, 160, 224, 5), ("Q5_1", 7, 96, 288, 3), ("F16", 7, 104, 96, 5)]


@pytest.mark.parametrize("fmt,E,F,D,k", SHAPES)
def test_moe_experts_decode(cp, rng, fmt, E, F, D, k):
    """moe_gu (rmsnorm staged) + moe_down vs NumpyOps.experts on the same ids / weights (the
    integer-dot contract on both sides for its formats); rows of an m-row call = 1-row calls."""
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.kernel_refs import act_q8
    from bw24chat.backends.numpy_backend import NumpyBackend

    g, u, d = _experts(fmt, E, F, D, rng)
    ex = cuda_moe.load_experts(g, u, d)
    nb = NumpyBackend(act_quant=act_q8(fmt))
    ref_ex = nb.load_experts(g, u, d)
    ops = nb.ops(nb.new_kv_cache(1, 1, 16, 16), 0, 8, 1e-6)
    m = 8
    x = rng.standard_normal((m, D)).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(m)]).astype(np.int32)
    ids[1] = ids[0]  # two rows on the same experts
    w = rng.random((m, k)).astype(np.float32)
    shared = rng.standard_normal((m, D)).astype(np.float32)
    res = rng.standard_normal((m, D)).astype(np.float32)
    h = ops.rmsnorm(x, nw)
    routed = ops.experts(h, ids, w, ref_ex, np.zeros_like(res))  # 0 + acc = acc exactly
    want = res + (routed + shared)  # the contract's order: routed sum, + shared, then the residual

    def run(rows):
        out = []
        for r0, r1 in rows:
            n = r1 - r0
            act = cp.zeros((n, k, F), cp.float32)
            ids_d, w_d = cp.asarray(ids[r0:r1]), cp.asarray(w[r0:r1])
            o = cp.asarray(res[r0:r1])
            cuda_moe.experts_gu(ex, cp.asarray(x[r0:r1]), ids_d, act, n, k, norm_w=cp.asarray(nw), eps=1e-6)
            cuda_moe.experts_down(ex, act, ids_d, w_d, cp.asarray(shared[r0:r1]), o, n, k)
            out.append(o.get())
        return np.concatenate(out)

    got = run([(0, m)])
    err = np.linalg.norm(got - want) / np.linalg.norm(routed)
    assert err <= 2e-5, err  # f32 sums in another order than NumPy over k x (F or D) terms: a few 1e-6, tails to 1e-5
    single = run([(i, i + 1) for i in range(m)])
    assert np.array_equal(got.view(np.uint32), single.view(np.uint32))
    for split in ([(0, 3), (3, 8)], [(0, 1), (1, 6), (6, 8)], [(0, 7), (7, 8)]):  # verify steps of 3, 5, 7 rows
        assert np.array_equal(got.view(np.uint32), run(split).view(np.uint32)), split


GEOMETRIES = [  # moe_experts.cu defines other than MOE_TUNING's: warps, window, outputs per down unit
    {"MOE_NW": 4, "MOE_U": 1, "MOE_MINB": 1},
    {"MOE_NW": 16, "MOE_U": 3, "MOE_MINB": 1, "MOE_R": 1},
    {"MOE_NW": 8, "MOE_U": 2, "MOE_MINB": 1, "MOE_R": 4},
    {"MOE_NW": 16, "MOE_U": 5, "MOE_MINB": 1, "MOE_R": 3},
    {"MOE_NW": 8, "MOE_U": 7, "MOE_MINB": 1, "MOE_R": 2},
]


@pytest.mark.parametrize("fmt,E,F,D,k", [sh for sh in SHAPES if sh[1] < 128] + [("Q8_0", 128, 768, 2048, 8),
                                                                                ("NVFP4", 128, 768, 2048, 8)])
def test_moe_experts_do_not_depend_on_the_geometry(cp, rng, fmt, E, F, D, k):
    """moe_gu's act and moe_down's residual rows are the same bits at every block size, window and
    unit height (each output's sum: one lane group, its lanes' chunk order fixed; down's experts
    combined in ranking order), at m = 1 and m = 5."""
    from bw24chat.backends import cuda_moe

    g, u, d = _experts(fmt, E, F, D, rng)
    ex = cuda_moe.load_experts(g, u, d)
    for m in (1, 5):
        x = cp.asarray(rng.standard_normal((m, D)).astype(np.float32))
        nw = cp.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
        ids = cp.asarray(np.stack([rng.permutation(E)[:k] for _ in range(m)]).astype(np.int32))
        w = cp.asarray(rng.random((m, k)).astype(np.float32))
        res = rng.standard_normal((m, D)).astype(np.float32)

        def run(geo):
            act = cp.zeros((m, k, F), cp.float32)
            o = cp.asarray(res)
            cuda_moe.experts_gu(ex, x, ids, act, m, k, norm_w=nw, eps=1e-6, geo=geo)
            cuda_moe.experts_down(ex, act, ids, w, None, o, m, k, geo=geo)
            return act.get(), o.get()

        want_act, want_res = run(None)
        for geo in GEOMETRIES:
            got_act, got_res = run(geo)
            assert np.array_equal(got_act.view(np.uint32), want_act.view(np.uint32)), (m, geo)
            assert np.array_equal(got_res.view(np.uint32), want_res.view(np.uint32)), (m, geo)


@pytest.mark.parametrize("fmt,E,F,D,k", [("Q8_0", 11, 224, 352, 6), ("NVFP4", 128, 768, 2048, 8), ("BF16", 8, 96, 256, 3),
                                         ("Q4_K", 9, 256, 512, 5), ("MXFP4", 8, 96, 256, 3)])
def test_experts_held_elsewhere(cp, rng, fmt, E, F, D, k):
    """A GPU of a split model holds experts lo..hi-1 (cuda_sharded.py): its decode partial
    (moe_gu + moe_down with add 0) and its grouped prefill partial are, bit for bit, the whole
    layer's with the router weights of every other expert set to 0 (acc + 0 * y = acc), at m rows
    and row by row; against NumpyOps.experts' partial (zeros for the others) to f32 rounding; and a
    row none of whose experts are held gives its shared row alone."""
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.kernel_refs import act_q8
    from bw24chat.backends.numpy_backend import NumpyBackend
    from bw24chat.loaders.tensor import ExpertTensor

    g, u, d = _experts(fmt, E, F, D, rng)
    whole = cuda_moe.load_experts(g, u, d)
    nb = NumpyBackend(act_quant=act_q8(fmt))
    ops = nb.ops(nb.new_kv_cache(1, 1, 16, 16), 0, 8, 1e-6)
    m = 8
    x = rng.standard_normal((m, D)).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(m)]).astype(np.int32)
    w = rng.random((m, k)).astype(np.float32)
    shared = rng.standard_normal((m, D)).astype(np.float32)
    h = ops.rmsnorm(x, nw)

    def decode(ex, ww, rows, add=False, res=None):
        out = []
        for r0, r1 in rows:
            n = r1 - r0
            act = cp.full((n, k, F), np.nan, cp.float32)
            o = cp.full((n, D), np.nan, cp.float32) if res is None else cp.asarray(res[r0:r1])
            ids_d = cp.asarray(ids[r0:r1])
            cuda_moe.experts_gu(ex, cp.asarray(x[r0:r1]), ids_d, act, n, k, norm_w=cp.asarray(nw), eps=1e-6)
            cuda_moe.experts_down(ex, act, ids_d, cp.asarray(ww[r0:r1]), cp.asarray(shared[r0:r1]), o, n, k, add=add)
            out.append(o.get())
        return np.concatenate(out)

    for lo, hi in ((0, E // 2), (E // 2, E), (1, 2)):
        elsewhere = [e for e in range(E) if not lo <= e < hi]
        none_here = len(elsewhere) >= k
        if none_here:  # row 0: no expert held here
            ids[0] = elsewhere[:k]
        part = cuda_moe.load_experts(*(ExpertTensor(t.name, t.parts[lo:hi]) for t in (g, u, d)), first=lo, n_table=E)
        assert part.held == (lo, hi)
        masked = np.where((ids >= lo) & (ids < hi), w, np.float32(0))
        want = decode(whole, masked, [(0, m)], add=True, res=np.zeros((m, D), np.float32))
        got = decode(part, w, [(0, m)])
        assert _same_bits(got, want), (lo, hi)
        assert _same_bits(decode(part, w, [(i, i + 1) for i in range(m)]), got), (lo, hi)
        if none_here:
            assert _same_bits(got[0], np.float32(0) + shared[0]), (lo, hi)
        ref_part = nb.load_experts(*(ExpertTensor(t.name, t.parts[lo:hi]) for t in (g, u, d)))
        ref_part.first = lo
        ref = ops.experts(h, ids, w, ref_part, np.zeros((m, D), np.float32)) + shared
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 2e-5, (lo, hi)
        # the grouped prefill's partial: the per-expert GEMMs of the held experts, and the whole layer masked
        T = 37
        pids = _routes(rng, T, k, E)
        ph = rng.standard_normal((T, D)).astype(np.float32)
        pw = rng.random((T, k)).astype(np.float32)
        psh = rng.standard_normal((T, D)).astype(np.float32)
        out = cp.full((T, D), np.nan, cp.float32)
        cuda_moe.prefill_experts(part, cp.asarray(ph), cp.asarray(pids), cp.asarray(pw), cp.asarray(psh), out, T, k,
                                 add=False)
        assert _same_bits(out.get(), _per_expert_prefill(cp, part, ph, pids, pw, psh, None)), (lo, hi)
        pmasked = np.where((pids >= lo) & (pids < hi), pw, np.float32(0))
        assert _same_bits(out.get(), _grouped_prefill(cp, whole, ph, pids, pmasked, psh, np.zeros((T, D), np.float32)))


def test_gated_or_unknown_formats_refused():
    from bw24chat.backends.cuda_moe import check_format

    with pytest.raises(NotImplementedError, match="FP8_E4M3"):
        check_format("FP8_E4M3", 768, 2048)


@pytest.fixture(scope="module")
def tiny_moe():
    from bw24chat.synthetic import synthetic_checkpoint

    return {fmt: synthetic_checkpoint("tiny-moe", fmt) for fmt in ("BF16", "Q8_0", "NVFP4", "MXFP4", "Q2_K", "Q3_K")}


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4", "MXFP4", "Q2_K", "Q3_K"])
@pytest.mark.parametrize("graph", [True, False])
def test_moe_rows_equal_single_steps(cp, tiny_moe, fmt, graph):
    """A decode step of m rows = m one-row steps, bit for bit (speculative verify = decode)."""
    from bw24chat.backends.cuda_runner import CudaRunner

    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 21)]
    rows = [int(t) for t in rng.integers(0, 4096, 8)]
    sp = SamplingParams(temperature=0)
    r = CudaRunner(tiny_moe[fmt], 512, "bf16", use_graph=graph)
    r.prefill(prompt, 0)
    single = []
    for i, t in enumerate(rows):
        r.step([t], len(prompt) + i, sp, 0, [])
        single.append(r.last_logits()[0])
    for m in (2, 5, 8):
        r.prefill(prompt, 0)
        r.step(rows[:m], len(prompt), sp, 0, [])
        assert np.array_equal(r.last_logits().view(np.uint32), np.stack(single[:m]).view(np.uint32)), m


def test_moe_greedy_tokens_equal_the_numpy_runner(cp, tiny_moe):
    from tests.gpu.test_runner_rows import greedy_tokens_cuda_and_numpy

    out = greedy_tokens_cuda_and_numpy(tiny_moe["BF16"])
    assert out["cuda"] == out["numpy"]


@pytest.mark.parametrize("shape", ["tiny-glm4-moe", "tiny-minimax-m2"])
def test_sigmoid_router_families_greedy_tokens_equal_the_numpy_runner(cp, shape):
    """GLM-4.5 (groups, scaling, shared expert, biases, partial RoPE) and MiniMax-M2 (full-width
    QK-norm) on the CUDA runner: the NumPy runner's greedy tokens."""
    from bw24chat.synthetic import synthetic_checkpoint
    from tests.gpu.test_runner_rows import greedy_tokens_cuda_and_numpy

    out = greedy_tokens_cuda_and_numpy(synthetic_checkpoint(shape, "BF16"))
    assert out["cuda"] == out["numpy"]


@pytest.mark.parametrize("family", ["qwen3_moe", "glm4_moe", "minimax_m2"])
def test_moe_prefill_argmax_equals_decode(cp, tmp_path, family):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.loaders import load_checkpoint
    from tests.model_factory import make_hf_dir

    d, _ = make_hf_dir(tmp_path / family, family, "BF16", head_dim=32)  # rope.cu: head dims of 32k
    ck = load_checkpoint(d)
    r = CudaRunner(ck, 256, "f32")
    ids = [int(t) for t in np.random.default_rng(5).integers(0, ck.config["vocab_size"], 24)]
    full = r.prefill_logits(np.array(ids), 0)
    steps = np.stack([r.decode_logits(t, i) for i, t in enumerate(ids)])
    np.testing.assert_array_equal(full.argmax(-1), steps.argmax(-1))
    np.testing.assert_allclose(full, steps, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- grouped prefill
def _routes(rng, T: int, k: int, E: int, skip=(), one: int | None = None) -> np.ndarray:
    from tests.test_cuda_moe import _assignments

    return _assignments(rng, T, k, E, skip, one)


@pytest.mark.parametrize("T,k,E,bm,one", [(37, 3, 7, 64, None), (512, 8, 128, 64, None), (300, 4, 16, 64, 5),
                                          (64, 8, 1024, 128, None), (513, 8, 160, 128, None), (1, 1, 1, 64, None)])
def test_moe_group_matches_reference(cp, rng, T, k, E, bm, one):
    """moe_group (counts, offsets, tile offsets, the permutation and its inverse) = kernel_refs.
    moe_group_ref exactly, on fresh routes: an expert nobody routes to, one expert on every row."""
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.kernel_refs import moe_group_ref

    ids = _routes(rng, T, k, E, skip=(0,) if E > k + 1 else (), one=one)
    cap = np.full((T + 3, k), -7, np.int32)  # the router's buffer is longer than the chunk
    cap[:T] = ids
    g = cuda_moe.group(cp.asarray(cap), T, k, E, bm)
    for got, want in zip((g.offs, g.toff, g.tok, g.pos), moe_group_ref(ids, E, bm)):
        np.testing.assert_array_equal(got.get(), want)
    assert int(g.toff[E].get()) <= g.max_tiles


def _per_expert_prefill(cp, ex, h, ids, w, shared, res, act_bf16=False, impl="mma"):
    from bw24chat.kernel_checks import per_expert_prefill

    return per_expert_prefill(cp, ex, h, ids, w, shared, res, act_bf16, impl)


def _grouped_prefill(cp, ex, h, ids, w, shared, res, act_bf16=False):
    from bw24chat.backends import cuda_moe

    T, k = ids.shape
    out = cp.asarray(res)
    cuda_moe.prefill_experts(ex, cp.asarray(h), cp.asarray(ids), cp.asarray(w), cp.asarray(shared), out, T, k,
                             act_bf16=act_bf16)
    return out.get()


def _layer(rng, fmt, E, F, D, T, k, **routes):
    from bw24chat.backends import cuda_moe

    ex = cuda_moe.load_experts(*_experts(fmt, E, F, D, rng))
    ids = _routes(rng, T, k, E, **routes)
    h = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    shared = rng.standard_normal((T, D)).astype(np.float32)
    res = rng.standard_normal((T, D)).astype(np.float32)
    return ex, (h, ids, w, shared, res)


def _same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


# every format the expert kernels take, at an odd chunk over 7 experts (expert 0 gets no row); F 96
# is not a whole 64-input k tile (the down projection's tail; Q8_0's down then runs gemm_mma's
# integer-dot planes, its gate|up gemm_i8_mma), F 128 puts Q8_0's down on gemm_i8_mma too; the
# K-quants need rows of whole 256-blocks, NVFP4 of 64 (the repacked layout)
GROUPED_FORMATS = [("BF16", 96), ("F16", 96), ("Q8_0", 96), ("Q8_0", 128), ("Q4_0", 96), ("Q4_1", 96), ("Q5_0", 96),
                   ("Q5_1", 96), ("Q4_K", 256), ("Q5_K", 256), ("Q6_K", 256), ("NVFP4", 192), ("MXFP4", 96),
                   ("Q2_K", 256), ("Q3_K", 256)]


@pytest.mark.parametrize("act_bf16", [False, True], ids=["f32-x", "bf16-x"])
@pytest.mark.parametrize("fmt,F", GROUPED_FORMATS)
def test_grouped_prefill_equals_per_expert_gemms(cp, rng, fmt, F, act_bf16):
    """The grouped prefill (moe_group + gemm_grouped / gemm_i8_grouped + moe_combine) = the
    per-expert lin.gemm path on the portable kernels (impl "mma") bit for bit; and one launch per
    expert (the spilled path's e0 / tiles launches) = one launch for all."""
    from bw24chat.backends import cuda_moe
    from bw24chat.backends.kernel_refs import moe_group_ref

    E, D, T, k = 7, 256, 37, 3
    ex, (h, ids, w, shared, res) = _layer(rng, fmt, E, F, D, T, k, skip=(0,))
    want = _per_expert_prefill(cp, ex, h, ids, w, shared, res, act_bf16)
    got = _grouped_prefill(cp, ex, h, ids, w, shared, res, act_bf16)
    assert _same_bits(got, want)

    # the streamed launches of a spilled layer: expert by expert, its own tiles only
    g = cuda_moe.group(cp.asarray(ids), T, k, E, cuda_moe.group_tile(T * k, E))
    offs = moe_group_ref(ids, E, g.bm)[0]
    act = cp.full((T * k, F), np.nan, cp.float32)
    Y = cp.full((T * k, D), np.nan, cp.float32)
    hd, opts = cp.asarray(h), dict(act_bf16=act_bf16)
    for e in range(E):
        r0, r1 = int(offs[e]), int(offs[e + 1])
        if r1 > r0:
            tiles = -(-(r1 - r0) // g.bm)
            cuda_moe.grouped_gemm(ex.gu, ex.gu.table, g, hd, act, "swiglu", gather=True, rows=(0, T), tag="moe_x", e0=e,
                                  tiles=tiles, **opts)
            cuda_moe.grouped_gemm(ex.down, ex.down.table, g, act, Y, rows=(r0, r1), e0=e, tiles=tiles, **opts)
    out = cp.asarray(res)
    cuda_moe.combine(Y, cp.asarray(w), cp.asarray(shared), out, T, k, cp.asarray(ids), g.pos)
    assert _same_bits(out.get(), want)


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4", "Q4_K", "MXFP4", "Q2_K", "Q3_K"])
def test_grouped_prefill_one_expert_on_every_row(cp, rng, fmt, monkeypatch):
    """Expert 3 on all 300 rows (5 tiles of 64 or 3 of 128, the last partial), the rest spread:
    = the per-expert path bit for bit, with either token tile and with one tile buffer (the
    99 KB GPUs' gemm_grouped)."""
    from bw24chat.backends import cuda_linear as lin
    from bw24chat.backends import cuda_moe

    ex, args = _layer(rng, fmt, 16, 256, 256, 300, 4, one=3)
    want = _per_expert_prefill(cp, ex, *args)
    for bm in (64, 128):
        monkeypatch.setattr(cuda_moe, "group_tile", lambda n, E, bm=bm: bm)
        assert _same_bits(_grouped_prefill(cp, ex, *args), want), bm
    monkeypatch.setattr(lin, "gemm_bufs", lambda x_split, w_split, bm=lin.GM_TILE: 1)
    assert _same_bits(_grouped_prefill(cp, ex, *args), want)


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "NVFP4", "MXFP4"])
def test_grouped_prefill_qwen3_30b_layer(cp, rng, fmt):
    """One Qwen3-30B-A3B layer at pp512 (T 512, 128 experts, top-8, F 768, D 2048): grouped =
    per-expert on the portable kernels bit for bit.  Q8_0 also equals the per-expert path on the
    production kernels of this GPU (sm_90a: gemm_i8, whose rows are gemm_i8_mma's); the other
    formats' production per-expert path on sm_90a is gemm_wgp / gemm_wra, bits of their own (the
    rounding-level difference is reported, not gated)."""
    from bw24chat.backends import cuda_linear as lin

    ex, args = _layer(rng, fmt, 128, 768, 2048, 512, 8)
    got = _grouped_prefill(cp, ex, *args)
    assert _same_bits(got, _per_expert_prefill(cp, ex, *args))
    prod = _per_expert_prefill(cp, ex, *args, impl=None)
    if fmt == "Q8_0" or lin.gemm_impl() == "mma":
        assert _same_bits(got, prod)
    else:
        res = args[-1]
        rel = np.linalg.norm(got - prod) / np.linalg.norm(got - res)
        print(f"{fmt}: grouped (mma.sync) vs per-expert {lin.gemm_impl()} prefill: rel {rel:.2e}")
        assert rel <= 1e-4
