"""The tensor-core integer-dot matvec's schedule (kernels/matvec_mma.cu) on the CPU: its chains split
over the warps of a sub-tile, their own tree levels and the block's residue levels
(kernel_refs.matvec_a8_mma_order) give the contract's rows (kernel_refs.matvec_a8_exact, the SIMT
kernel's 32 chains and xor tree) bit for bit, for 4 and 8 warps per sub-tile, 3 and 16 rows of x,
rows that end in a partial 32-chunk k-tile and rows shorter than one, and over K ranges (the
chains carried from one range's launch to the next as float32, each range's inputs quantized by
themselves) for every range count; and those rows are the quantized product within the f32
accumulation's rounding.  Fresh random weights and activations every run."""
import numpy as np
import pytest

from bw24chat.backends import cuda_linear as cl
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.kernel_refs import act_quant_ref, matvec_a8_exact, matvec_a8_mma_order
from tests.test_repack import random_qtensor


@pytest.mark.parametrize("fmt,in_", [(f, n) for f in ("Q8_0", "NVFP4", "Q4_K") for n in (256, 768, 1280)]
                         + [(f, n) for f in ("Q8_0", "NVFP4") for n in (576, 896)])
@pytest.mark.parametrize("m", [3, 16])  # one n-tile; four (cuda_linear.MMA_MAX_ROWS)
def test_mma_schedule_gives_the_contract_bits(rng, fmt, in_, m):
    """256 / 768 / 1280 inputs: 16, 48, 80 Q8_0 chunks, 8, 24, 40 of the 32-value formats; 576 and
    896 (Q8_0 / NVFP4 rows of 64k inputs, MQ_S4: SmolLM2-135M, Qwen2.5-0.5B): a partial k-tile whose
    chunks reach only some chains."""
    out = int(rng.integers(3, 40))
    t = random_qtensor(rng, fmt, out, in_, global_scale=0.37 if fmt == "NVFP4" else 1.0)
    hp = cw.repack_host([t])
    x = (rng.standard_normal((m, in_)) * rng.uniform(0.1, 10.0, (m, 1))).astype(np.float32)
    want = matvec_a8_exact(hp, x)
    for kw in (4, 8):
        got = matvec_a8_mma_order(hp, x, kw)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{kw} warps per sub-tile"
    xin = act_quant_ref(x).astype(np.float64)
    w = cw.decode_planes(hp).astype(np.float64)
    bound = np.abs(xin) @ np.abs(w).T
    assert np.all(np.abs(want - xin @ w.T) <= 1e-5 * bound + 1e-30)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4", "Q4_K"])
@pytest.mark.parametrize("in_", [2304, 3328])  # 4.5, 6.5 Q8_0 k-tiles; 2.25, 3.25 of the 32-value formats
def test_k_ranges_give_the_contract_bits(rng, fmt, in_):
    """matvec_mma.cu's K ranges: every range count (cuda_linear.mma_ranges, the last range ending in
    a partial k-tile), m = 1..8, odd row counts."""
    out = int(rng.integers(3, 40)) * 2 + 1
    t = random_qtensor(rng, fmt, out, in_, global_scale=0.37 if fmt == "NVFP4" else 1.0)
    hp = cw.repack_host([t])
    nkt = -(-(in_ // cw.vpc(fmt)) // 32)
    x = (rng.standard_normal((8, in_)) * rng.uniform(0.1, 10.0, (8, 1))).astype(np.float32)
    for m in range(1, 9):
        want = matvec_a8_exact(hp, x[:m])
        for r in range(1, nkt + 1):
            for kw in (4, 8):
                got = matvec_a8_mma_order(hp, x[:m], kw, cl.mma_ranges(nkt, r))
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"m = {m}, {r} ranges, {kw} warps per sub-tile"


def test_ranges_restarting_their_chains_differ(rng):
    """The equality above discriminates: ranges whose chains restart from +0 (their partial sums
    added at the end, chain by chain) give other bits on some outputs."""
    from bw24chat.backends import kernel_refs as kr

    t = random_qtensor(rng, "Q8_0", 64, 4096)
    hp = cw.repack_host([t])
    x = rng.standard_normal((4, 4096)).astype(np.float32)
    want = matvec_a8_exact(hp, x)
    v = sum(kr._a8_chains(*kr._a8_chain_steps(hp, x, kc0, kc0 + 128), lambda kc: kc % 32) for kc0 in (0, 128))
    for o in (16, 8, 4, 2, 1):
        v = v[..., :o] + v[..., o:2 * o]
    assert not np.array_equal(v[..., 0].view(np.uint32), want.view(np.uint32))


def test_another_tree_over_the_same_chains_differs(rng):
    """The equality above discriminates: the same 32 chains summed by another tree (neighbours
    first: levels 1, 2, ..., 16) give other bits on some outputs."""
    from bw24chat.backends import kernel_refs as kr

    t = random_qtensor(rng, "Q8_0", 64, 4096)
    hp = cw.repack_host([t])
    x = rng.standard_normal((4, 4096)).astype(np.float32)
    want = matvec_a8_exact(hp, x)
    steps, nck = kr._a8_chain_steps(hp, x)
    v = kr._a8_chains(steps, nck, lambda kc: kc % 32)
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    assert not np.array_equal(v[..., 0].view(np.uint32), want.view(np.uint32))
