"""Our NumPy dequantization is bit-identical to gguf.quants.dequantize, on random blocks of
every supported type and on the real model's tensors."""
import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as T

from bw24chat import quants

BLOCK_TYPES = sorted(t for t in quants.SUPPORTED if t not in (T.F32,))


def _random_blocks(rng, qtype, n_rows, n_blocks):
    """Random bytes with finite f16 scale fields (random codes, random scales)."""
    bs, ts = quants.block_info(qtype)
    raw = rng.integers(0, 256, size=(n_rows, n_blocks * ts), dtype=np.uint8)
    return raw


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: T(t).name)
def test_dequantize_bit_identical_to_gguf(qtype):
    rng = np.random.default_rng()
    for rows, blocks in ((1, 1), (3, 7), (17, 5)):
        raw = _random_blocks(rng, qtype, rows, blocks)
        with np.errstate(all="ignore"):  # random bytes make NaN/inf scales too
            ours = quants.dequantize(raw, qtype)
            theirs = gq.dequantize(raw, qtype).astype(np.float32)
        assert ours.shape == theirs.shape
        # bit patterns, NaN payloads included (random bytes make NaN/inf scales too)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_row_bytes_checks_block_multiple():
    assert quants.row_bytes(T.Q4_K, 512) == 2 * 144
    with pytest.raises(ValueError):
        quants.row_bytes(T.Q4_K, 100)


def test_real_model_tensors_bit_identical(smollm2):
    seen = set()
    for name, t in smollm2.tensors.items():
        if t.fmt in seen:
            continue
        seen.add(t.fmt)
        raw = np.asarray(t.raw)[:64]
        ours = quants.dequantize(raw, T[t.fmt])
        theirs = gq.dequantize(raw, T[t.fmt]).astype(np.float32)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert {"Q4_1", "Q8_0", "F32"} <= seen
