"""CPU tests of the NumPy references the CUDA kernels are checked against (kernel_refs.py)."""
import numpy as np
import pytest

from bw24chat.backends import kernel_refs as kr
from bw24chat.backends.numpy_backend import NumpyBackend, NumpyKVCache
from bw24chat.sampling import philox_uniform


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


def test_philox_first_raw_equals_numpy(rng):
    cases = [(0, 0), (1, 0), (2**64 - 1, 2**64 - 1), (2**127 + 12345, 7), (42, 2**63)]
    cases += [(int(rng.integers(0, 2**63)) << int(rng.integers(0, 65)), int(rng.integers(0, 2**40))) for _ in range(50)]
    for seed, pos in cases:
        key = np.array([seed & (2**64 - 1), (seed >> 64) & (2**64 - 1)], np.uint64)
        bg = np.random.Philox(key=key, counter=np.array([pos, 0, 0, 0], np.uint64))  # arrays: exact uint64
        assert kr.philox_first_raw(seed, pos) == int(bg.random_raw()), (seed, pos)
    seed, pos = 123456789, 4242  # sampling.philox_uniform builds Philox from lists: keep < 2^63
    assert (kr.philox_first_raw(seed, pos) >> 11) * 2.0**-53 == philox_uniform(seed, pos)


def test_bf16_rounding():
    x = np.array([1.0, -2.5, 0.0, np.inf], np.float32)
    assert np.array_equal(kr.bf16_round(x), x)
    ties = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF], np.uint32).view(np.float32)
    assert list(kr.bf16_round_bits(ties)) == [0x3F80, 0x3F82, 0x3F81, 0x3F80]
    assert np.isnan(kr.bf16_round(np.array([np.nan], np.float32)))[0]


def test_e4m3_roundtrip_and_rounding(rng):
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    vals = kr.e4m3_decode(codes)
    assert np.array_equal(kr.e4m3_round(vals), vals)
    assert np.array_equal(kr.e4m3_encode(vals)[vals != 0], codes[vals != 0])
    assert kr.e4m3_round(np.array([1000.0, -460.0], np.float32)).tolist() == [448.0, -448.0]
    # halfway between 1 and 1.125 -> even mantissa (1.0); between 1.125 and 1.25 -> 1.25
    assert kr.e4m3_round(np.array([1.0625, 1.1875], np.float32)).tolist() == [1.0, 1.25]
    x = rng.standard_normal(10000).astype(np.float32) * 50
    r = kr.e4m3_round(x).astype(np.float64)
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0**-4 + 2.0**-10)


def test_q8_0_matches_ggml(rng):
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    x = (rng.standard_normal((7, 128)) * rng.uniform(0.01, 10, (7, 1))).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: d = 0
    codes, scales = kr.kv_quantize(x, "q8_0")
    ref = quantize(x, GGMLQuantizationType.Q8_0).reshape(7, 4, 34)
    assert np.array_equal(ref[..., :2].copy().view(np.float16)[..., 0], scales)
    assert np.array_equal(ref[..., 2:].copy().view(np.int8).reshape(7, 128), codes)


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
def test_kv_cache_pack_roundtrip(rng, kv_type):
    N, K, hd = 5, 3, 64
    x = rng.standard_normal((N, K, hd)).astype(np.float32)
    codes, scales = kr.kv_quantize(x, kv_type)
    buf = kr.kv_cache_pack(codes, scales, kv_type)
    assert buf.nbytes == kr.kv_cache_nbytes(kv_type, N, K, hd)
    assert buf.shape == kr.kv_cache_shape(kv_type, N, K, hd)[0]
    vals = kr.kv_cache_values(buf, kv_type, N, K, hd)
    rel = {"bf16": 2.0**-8, "q8_0": 1 / 127, "fp8": 2.0**-3, "f32": 0.0}[kv_type]
    amax = np.abs(x).max(axis=-1, keepdims=True)
    assert np.all(np.abs(vals - x) <= rel * amax)


@pytest.mark.parametrize("min_per", [1, 2, 4])
def test_decode_splits_cover_and_bound(min_per):
    for ms in (1, 5, 33, 64):
        for L in list(range(1, 200)) + [511, 512, 8192, 8193, 32768, 40000]:
            n, per = kr.decode_splits(L, ms, min_per=min_per)
            assert 1 <= n <= ms and per % kr.DECODE_TILE == 0 and per >= min_per * kr.DECODE_TILE
            assert (n - 1) * per < L <= n * per


def test_flash_reference_equals_plain_attention(rng):
    T, H, K, hd, start = 9, 6, 2, 32, 70
    S = start + T
    keys = rng.standard_normal((S, K, hd)).astype(np.float32)
    vals = rng.standard_normal((S, K, hd)).astype(np.float32)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    pos = np.arange(start, start + T)
    ref = kr.attention_ref(q, keys, vals, pos, 0.2)
    for block in (1, 16, 64):
        got = kr.attention_flash_ref(q, keys, vals, pos, 0.2, block=block)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # and the float32 backend's attention is the same contract
    cache = NumpyKVCache(1, K, hd, S)
    cache.ensure(start)
    cache.k[0, :start], cache.v[0, :start] = keys[:start], vals[:start]
    o = NumpyBackend().attention(q, keys[start:], vals[start:], cache, 0, start, 0.2)
    np.testing.assert_allclose(o.reshape(T, H, hd), ref, rtol=1e-4, atol=1e-5)


def test_f32_cache_is_exact(rng):
    N, K, hd = 4, 2, 64
    x = rng.standard_normal((N, K, hd)).astype(np.float32)
    buf = kr.kv_cache_pack(*kr.kv_quantize(x, "f32"), "f32")
    assert buf.dtype == np.float32 and buf.shape == (N, K, hd)
    assert kr.kv_cache_nbytes("f32", N, K, hd) == 4 * N * K * hd
    assert np.array_equal(kr.kv_cache_values(buf.view(np.uint8), "f32", N, K, hd), x)


def test_kv_split_residual_bound(rng):
    """The prefill's hi + lo split of exact K/V values (KV_SPLIT): |v - (hi + lo)| <= 2^-16 |v|,
    and the dropped lo.lo product of an MMA is below 2^-16 of the hi.hi one."""
    v = (rng.standard_normal(100000) * 10.0 ** rng.uniform(-3, 3, 100000)).astype(np.float32)
    hi, lo = kr.bf16x2_split(v)
    r = np.abs(v.astype(np.float64) - hi - lo)
    assert np.all(r <= np.abs(v) * 2.0**-16)
    assert np.all(np.abs(lo) <= np.abs(hi) * 2.0**-8)
