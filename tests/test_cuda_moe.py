"""CPU side of the CUDA MoE path (backends/cuda_moe.py): launch planning (grids from the SM count,
the geometry table), format refusal, and the router reference's summation tree
(numpy_backend.warp_sum_rows, moe_router.cu's order)."""
import numpy as np
import pytest

from bw24chat.backends import cuda_moe, tuning
from bw24chat.backends.numpy_backend import warp_sum_rows


@pytest.mark.parametrize("F,k,m,want", [(768, 8, 1, 264), (768, 8, 8, 33), (768, 8, 3, 88), (96, 3, 1, 36), (1536, 8, 2, 132)])
def test_gu_blocks_fill_the_gpu_once(F, k, m, want):
    """moe_gu at 2 resident blocks of 8 warps on 132 SMs: m rows x blocks = the resident capacity
    (one wave), never more blocks than a row's pairs give its warps."""
    gx = cuda_moe.gu_blocks(F, k, m, nw=8, resident=2, sms=132)
    assert gx == want
    assert gx <= -(-k * F // 8) and (gx * m >= 264 or gx == -(-k * F // 8))


@pytest.mark.parametrize("D,m,r,want", [(2048, 1, 2, 8), (2048, 1, 1, 8), (2048, 8, 2, 64), (2048, 3, 2, 24), (4096, 1, 4, 16),
                                        (96, 1, 2, 2), (2048, 4, 3, 33)])
def test_down_rows_fill_the_gpu_once(D, m, r, want):
    rb = cuda_moe.down_rows(D, m, r, resident=2, sms=132)
    assert rb == want and rb % r == 0
    assert -(-D // rb) * m <= 264 or rb == r  # at most one wave of blocks


def test_every_format_has_a_geometry():
    from bw24chat.backends.cuda_weights import FORMATS

    for fmt in FORMATS:
        for kern in ("gu", "down"):
            g = cuda_moe.geometry(kern, fmt)
            assert g["MOE_NW"] in (4, 8, 16) and 1 <= g["MOE_U"] <= 12 and g["MOE_MINB"] >= 1
            assert g["MOE_NW"] * 32 * g["MOE_MINB"] <= 1024  # 128 registers a thread at least
    assert cuda_moe.geometry("gu", "Q6_K") == tuning.MOE_TUNING[("gu", "*")]


def test_shared_memory_plans(monkeypatch):
    """The expert table (5 pointers an expert, whole 16 bytes) ahead of the staged inputs: floats
    padded to whole warp tiles, or the integer-dot contract's two int8 code planes and two 16-byte
    records per 32 inputs (3 bytes an input); moe_down also holds the residual, shared and k
    expert outputs of its outputs, in whole 16 bytes."""
    monkeypatch.delenv("BW24CHAT_A8", raising=False)
    assert cuda_moe.gu_smem("BF16", 2048, 128) == 8 * 5 * 128 + 4 * 2048
    assert cuda_moe.gu_smem("BF16", 2048, 3) == 8 * 16 + 4 * 2048
    assert cuda_moe.gu_smem("Q8_0", 2048, 128) == 8 * 5 * 128 + 3 * 2048
    assert cuda_moe.gu_smem("Q4_0", 2016, 3) == 8 * 16 + 4 * 2048  # exact activations: floats, 1024-value tiles
    assert cuda_moe.down_smem("Q8_0", 768, 8, 16, 128) == 8 * 5 * 128 + 4 * (2 + 8) * 16 + 8 * 3 * 768
    assert cuda_moe.down_smem("BF16", 768, 8, 6, 128) == 8 * 5 * 128 + 4 * (2 + 8) * 8 + 8 * 4 * 768
    assert cuda_moe.down_smem("NVFP4", 1408, 8, 64, 160) <= 99 * 1024  # GLM-4.5's expert width at m = 8, sm_120's block


def test_formats_refused_by_name():
    with pytest.raises(NotImplementedError, match="IQ4_NL"):
        cuda_moe.check_format("IQ4_NL", 768, 2048)
    with pytest.raises(NotImplementedError, match="Q8_0.*expert width 48"):
        cuda_moe.check_format("Q8_0", 48, 2048)
    cuda_moe.check_format("NVFP4", 768, 2048)


def test_gate_and_up_in_two_formats_refused():
    """gate and up are one interleaved matrix of one format (cuda_weights.fused_shape), checked
    before anything is allocated."""
    from bw24chat.loaders.tensor import ExpertTensor
    from tests.test_repack import random_qtensor

    rng = np.random.default_rng(0)
    gate = ExpertTensor("blk.0.ffn_gate_exps", [random_qtensor(rng, "Q4_K", 256, 256, "g")])
    up = ExpertTensor("blk.0.ffn_up_exps", [random_qtensor(rng, "Q8_0", 256, 256, "u")])
    down = ExpertTensor("blk.0.ffn_down_exps", [random_qtensor(rng, "Q8_0", 256, 256, "d")])
    with pytest.raises(ValueError, match="one format"):
        cuda_moe.load_experts(gate, up, down)


def test_warp_sum_rows_is_the_butterfly_of_lane_sums():
    rng = np.random.default_rng(0)
    v = rng.random((5, 160)).astype(np.float32)
    got = warp_sum_rows(v)
    lanes = [np.float32(0)] * 32
    for e in range(160):
        lanes[e % 32] = np.float32(lanes[e % 32] + v[0, e])
    for o in (16, 8, 4, 2, 1):
        lanes = [np.float32(lanes[i] + lanes[i + o]) for i in range(o)]
    assert got[0] == lanes[0]
    np.testing.assert_allclose(got, v.sum(-1), rtol=1e-6)


@pytest.mark.parametrize("fmt", [f for f in cuda_moe.FORMATS if f != "F32"])  # F32: BF16's plain copy, no generator
def test_expert_images_hold_each_plane_aligned_and_whole(fmt):
    """An expert's image (one copy moves an expert between tiers) holds its gate|up and down
    planes at ALIGN-aligned, non-overlapping offsets, byte for byte as repack_host makes them
    (the host's image, ExpertSource.image: repack.cu's reference)."""
    from bw24chat.backends.cuda_weights import repack_host
    from bw24chat.loaders.tensor import ExpertTensor
    from bw24chat.synthetic import random_experts

    rng = np.random.default_rng(0)
    E, F, D = 3, 256, 512
    g, u, d = (ExpertTensor(n, random_experts(fmt, E, r, c, rng)) for n, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
    gu_lay, dn_lay, image_bytes = cuda_moe.expert_layouts(g, u, d)
    src = cuda_moe.ExpertSource(g, u, d, gu_lay, dn_lay, image_bytes)
    spans = sorted((off, off + int(np.prod(sh)) * np.dtype(dt).itemsize) for lay in (gu_lay, dn_lay)
                   for _, off, sh, dt in lay.planes)
    assert all(a % cuda_moe.ALIGN == 0 for a, _ in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:])) and spans[-1][1] <= image_bytes
    for e in range(E):
        img = src.image(e, np.full(image_bytes, 0xAB, np.uint8))
        for hp, lay in ((repack_host([g.parts[e], u.parts[e]], interleave=True), gu_lay), (repack_host([d.parts[e]]), dn_lay)):
            for name, off, sh, dt in lay.planes:
                want = getattr(hp, name)
                got = img[off:off + want.nbytes].view(want.dtype).reshape(want.shape)
                assert np.array_equal(got, want), (fmt, e, name)


def _assignments(rng, T: int, k: int, E: int, skip=(), one: int | None = None) -> np.ndarray:
    """Router-like ids (T, k): k distinct experts per row, none of ``skip``; with ``one``, every
    row's first slot is that expert."""
    pool = np.array([e for e in range(E) if e not in skip and e != one])
    ids = np.stack([rng.permutation(pool)[:k] for _ in range(T)]).astype(np.int32)
    if one is not None:
        ids[:, 0] = one
    return ids


@pytest.mark.parametrize("T,k,E,bm,one", [(37, 3, 8, 64, None), (512, 8, 128, 64, None), (300, 4, 16, 64, 5),
                                          (5, 8, 256, 128, None), (1, 1, 1, 64, None)])
def test_moe_group_reference(T, k, E, bm, one):
    """kernel_refs.moe_group_ref (what moe_group.cu computes): each expert's grouped rows are its
    assignments in ascending order, offs / toff the exclusive scans of the counts / tiles, pos the
    inverse of the permutation; and cuda_moe.Groups.max_tiles bounds the tile count."""
    from bw24chat.backends.kernel_refs import moe_group_ref

    rng = np.random.default_rng(T * 1000 + E)
    ids = _assignments(rng, T, k, E, skip=(E - 1,) if E > k + 1 else (), one=one)
    offs, toff, tok, pos = moe_group_ref(ids, E, bm)
    flat = ids.reshape(-1)
    assert offs[0] == 0 and offs[E] == T * k and toff[0] == 0
    a_of_row = np.empty(T * k, np.int64)
    a_of_row[pos] = np.arange(T * k)  # pos is a permutation
    assert np.array_equal(np.sort(pos), np.arange(T * k))
    for e in range(E):
        want = np.nonzero(flat == e)[0]  # ascending a = t k + j
        rows = np.arange(offs[e], offs[e + 1])
        assert np.array_equal(a_of_row[rows], want)
        assert np.array_equal(tok[rows], want // k)
        assert toff[e + 1] - toff[e] == -(-len(want) // bm)
    if E > k + 1:
        assert offs[E] == offs[E - 1]  # the expert no row routes to: no rows, no tiles
    g = cuda_moe.Groups(None, None, None, None, T * k, E, bm)
    assert toff[E] <= g.max_tiles


def test_max_tiles_bound_is_tight_at_its_extremes():
    assert cuda_moe.Groups(None, None, None, None, 4096, 128, 64).max_tiles == (4096 + 128 * 63) // 64
    assert cuda_moe.Groups(None, None, None, None, 3, 128, 64).max_tiles == 3  # one row per expert: one tile each
    assert cuda_moe.Groups(None, None, None, None, 640, 1, 64).max_tiles == 10


@pytest.mark.parametrize("n,E,want", [(4096, 128, 64), (8192, 128, 128), (16, 8, 64), (4096 * 4, 128, 128), (96, 1, 128)])
def test_group_tile(n, E, want):
    assert cuda_moe.group_tile(n, E) == want
