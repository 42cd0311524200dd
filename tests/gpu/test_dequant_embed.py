"""Dequantization and embedding gather on the device: 0 bit mismatches against
bw24chat.quants.dequantize (QTensor.dequantize: times the NVFP4 global scale) for every format,
fused tensors, odd sizes, fresh random blocks every run; outputs poisoned with NaN first."""
import numpy as np
import pytest

from bw24chat.backends import cuda_weights as cw
from tests.test_repack import random_qtensor

FMTS = list(cw.FORMATS)


def block_of(fmt: str) -> int:
    from bw24chat import quants

    bs = 1 if fmt in ("F32", "F16", "BF16") else quants.block_info(quants.T[fmt])[0]
    return max(bs, cw.vpc(fmt))


def make_weight(rng, fmt, rows=(37, 5), nblocks=None):
    in_ = block_of(fmt) * (nblocks or int(rng.integers(1, 7)))
    gs = (0.5, 3.0e-2) if fmt == "NVFP4" else (1.0, 1.0)
    ts = [random_qtensor(rng, fmt, r, in_, f"w{i}", gs[i]) for i, r in enumerate(rows)]
    ref = np.concatenate([t.dequantize() for t in ts], axis=0).astype(np.float32)
    return ts, ref


def bits_equal(got, ref) -> int:
    return int(np.sum(got.view(np.uint32) != ref.view(np.uint32)))


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_bit_exact(cp, rng, fmt):
    from bw24chat.backends import cuda_linear as cl

    ts, ref = make_weight(rng, fmt)
    W = cw.upload(ts)
    assert (W.out, W.in_) == ref.shape
    out = cp.full(ref.shape, cp.nan, dtype=cp.float32)
    cl.dequantize(W, out)
    got = cp.asnumpy(out)
    assert bits_equal(got, ref) == 0, f"{bits_equal(got, ref)} bit mismatches"


@pytest.mark.parametrize("fmt", FMTS)
def test_embed_bit_exact(cp, rng, fmt):
    from bw24chat.backends import cuda_linear as cl

    ts, ref = make_weight(rng, fmt, rows=(61,))
    W = cw.upload(ts)
    for T in (1, 7, 40):
        ids = rng.integers(0, W.out, T).astype(np.int32)
        out = cp.full((T, W.in_), cp.nan, dtype=cp.float32)
        cl.embed(W, cp.asarray(ids), out)
        got = cp.asnumpy(out)
        assert bits_equal(got, ref[ids]) == 0


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "NVFP4"])
def test_embed_of_a_vocabulary_range(cp, rng, fmt):
    """One GPU's share of an embedding split by vocabulary (parallel.py): the table holds ids
    [lo, lo + rows); the ids in it give their rows, the others zeros (bit for bit)."""
    from bw24chat.backends import cuda_linear as cl

    ts, ref = make_weight(rng, fmt, rows=(29,))
    W = cw.upload(ts)
    lo = 40
    ids = rng.integers(0, 120, 53).astype(np.int32)
    ids[:3] = (lo - 1, lo, lo + W.out)  # the range's edges
    out = cp.full((len(ids), W.in_), cp.nan, dtype=cp.float32)
    cl.embed(W, cp.asarray(ids), out, lo=lo)
    want = np.zeros((len(ids), W.in_), np.float32)
    mine = (ids >= lo) & (ids < lo + W.out)
    want[mine] = ref[ids[mine] - lo]
    assert bits_equal(cp.asnumpy(out), want) == 0


def test_dequantize_large_q4_k(cp, rng):
    """A matrix with many chunks per row: the grid-stride loop and row arithmetic."""
    from bw24chat.backends import cuda_linear as cl

    ts, ref = make_weight(rng, "Q4_K", rows=(300,), nblocks=16)
    W = cw.upload(ts)
    out = cp.full(ref.shape, cp.nan, dtype=cp.float32)
    cl.dequantize(W, out)
    assert bits_equal(cp.asnumpy(out), ref) == 0
