"""Quantize-at-load, tested by properties (gguf 0.19 has no NVFP4 quantizer to compare with)."""
import numpy as np
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as T

from bw24chat.loaders.tensor import FP8_E4M3
from bw24chat.quantize import E2M1_VALUES, e2m1_round, e4m3_round, quantize_nvfp4, quantize_q8_0

E2M1_SIGNED = np.concatenate([E2M1_VALUES, -E2M1_VALUES])


def test_values_on_the_grid_round_trip_exactly():
    rng = np.random.default_rng()
    rows, cols = 6, 256
    g = np.float32(2.0**-12)  # the global scale the quantizer will find again (power of two)
    codes = rng.integers(0, 16, (rows, cols // 16, 16))
    codes[:, :, 0] = rng.choice([7, 15], (rows, cols // 16))  # each block holds a +-6: its amax is 6 * scale
    scale_codes = rng.integers(0x20, 0x7F, (rows, cols // 16)).astype(np.uint8)
    scale_codes[0, 0] = 0x7E  # 448: the tensor amax is 6 * 448 * g, so g comes back exactly
    w = (E2M1_SIGNED[codes] * FP8_E4M3[scale_codes][..., None] * g).reshape(rows, cols).astype(np.float32)
    q = quantize_nvfp4(w)
    assert q.global_scale == g
    np.testing.assert_array_equal(q.dequantize(), w)


def test_error_per_block_is_bounded_by_the_format():
    """|w - dq| <= half the E2M1 step at that magnitude times the block's scale (+ the scale's
    own rounding): with E2M1 steps of at most 2 (4 -> 6) the bound is 1 * s_b * g per value,
    and values below the block amax/6 * 0.25 may flush to zero."""
    rng = np.random.default_rng()
    w = (rng.standard_normal((16, 512)) * rng.uniform(0.001, 1.0, (16, 1))).astype(np.float32)
    q = quantize_nvfp4(w)
    dq = q.dequantize()
    blocks = np.abs(w).reshape(16, -1, 16).max(-1)
    s = blocks / 6.0  # ideal block scale in value units
    err = np.abs(dq - w).reshape(16, -1, 16).max(-1)
    assert np.all(err <= 1.0 * s * 1.07 + 1e-12)  # E4M3 rounding of the scale: < 6.25% relative
    rel = np.linalg.norm(dq - w) / np.linalg.norm(w)
    assert rel < 0.12


def test_nvfp4_output_dequantizes_through_gguf_to_the_same_values():
    rng = np.random.default_rng()
    w = rng.standard_normal((5, 192)).astype(np.float32)
    q = quantize_nvfp4(w)
    via_gguf = gq.dequantize(q.raw, T.NVFP4).astype(np.float32) * np.float32(q.global_scale)
    np.testing.assert_array_equal(via_gguf, q.dequantize())


def test_rounding_helpers_ties_to_even():
    np.testing.assert_array_equal(e2m1_round(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.2, 9.0, -9.0], np.float32)),
                                  [0, 2, 2, 4, 4, 6, 6, 0, 7, 15])
    x = FP8_E4M3[np.arange(1, 0x7F)]
    np.testing.assert_array_equal(e4m3_round(x), np.arange(1, 0x7F))
    assert e4m3_round(np.array([1e9], np.float32))[0] == 0x7E


def test_q8_0_is_ggml_reference():
    rng = np.random.default_rng()
    w = rng.standard_normal((3, 64)).astype(np.float32)
    q = quantize_q8_0(w)
    np.testing.assert_array_equal(np.asarray(q.raw), gq.quantize(w, T.Q8_0))
    assert np.abs(q.dequantize() - w).max() <= np.abs(w).max() / 127
