"""CPU tests of the NumPy references the CUDA kernels are checked against (kernel_refs.py)."""
import numpy as np
import pytest

from bw24chat.backends import kernel_refs as kr
from bw24chat.backends.numpy_backend import NumpyBackend, NumpyKVCache
from bw24chat.ops import AttentionSpec
from bw24chat.sampling import philox_uniform


def test_philox_first_raw_equals_numpy(rng):
    cases = [(0, 0), (1, 0), (2**64 - 1, 2**64 - 1), (2**127 + 12345, 7), (42, 2**63)]
    cases += [(int(rng.integers(0, 2**63)) << int(rng.integers(0, 65)), int(rng.integers(0, 2**40))) for _ in range(50)]
    for seed, pos in cases:
        key = np.array([seed & (2**64 - 1), (seed >> 64) & (2**64 - 1)], np.uint64)
        bg = np.random.Philox(key=key, counter=np.array([pos, 0, 0, 0], np.uint64))  # arrays: exact uint64
        assert kr.philox_first_raw(seed, pos) == int(bg.random_raw()), (seed, pos)
    seed, pos = 123456789, 4242  # sampling.philox_uniform builds Philox from lists: keep < 2^63
    assert (kr.philox_first_raw(seed, pos) >> 11) * 2.0**-53 == philox_uniform(seed, pos)


@pytest.mark.parametrize("full", [False, True])
def test_qk_norm_ref_is_the_numpy_backends_rmsnorm(rng, full):
    """rope.cu's QK-norm reference states NumpyBackend.rope_kv's RMSNorm (per head, or over the
    whole projection for MiniMax-M2) up to the order of its sums."""
    from bw24chat.backends.numpy_backend import rmsnorm_ref

    T, n, hd = 5, 7, 96
    x = (rng.standard_normal((T, n, hd)) * rng.uniform(0.1, 10, (T, 1, 1))).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n * hd if full else hd).astype(np.float32)
    got = kr.qk_norm_ref(x, w, 1e-6, full)
    want = rmsnorm_ref(x.reshape(T, n * hd), w, 1e-6).reshape(T, n, hd) if full else rmsnorm_ref(x, w, 1e-6)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_head_sum_sq_order(rng):
    """S(x): 32 lane partials over the strided values, then the xor butterfly (the same on every lane)."""
    x = rng.standard_normal((3, 128)).astype(np.float32)
    for r in range(3):
        part = np.zeros(32, np.float32)
        for i in range(4):
            part = part + x[r, 32 * i:32 * i + 32] * x[r, 32 * i:32 * i + 32]
        for o in (16, 8, 4, 2, 1):
            part = np.array([part[j] + part[j ^ o] for j in range(32)], np.float32)
        assert len(set(part.view(np.uint32).tolist())) == 1
        assert kr.head_sum_sq(x[r]).view(np.uint32) == part[0].view(np.uint32)
    np.testing.assert_allclose(kr.head_sum_sq(x), (x.astype(np.float64) ** 2).sum(-1), rtol=1e-6)


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


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
def test_paged_pool_holds_a_sequence_as_the_contiguous_cache(rng, kv_type):
    """A sequence's K/V scattered into a pool through a random block table (paged_rows, the rows
    rope.cu writes and the paged attention reads), gathered back (kv_cache_gather), is the
    contiguous cache's buffer byte for byte; paged_rows is the NumPy pool's own mapping."""
    from bw24chat.backends.numpy_backend import NumpyKVPool

    page, n_blocks, K, hd = 4, 11, 3, 96
    L = int(rng.integers(1, 7 * page))  # odd lengths: a partly filled last block
    table = rng.permutation(n_blocks)[:-(-L // page)].astype(np.int32)
    rows = kr.paged_rows(table, np.arange(L), page)
    pool = NumpyKVPool(1, K, hd, n_blocks, page)
    assert np.array_equal(rows, pool.view(table).slots(0, L))
    x = rng.standard_normal((L, K, hd)).astype(np.float32)
    codes, scales = kr.kv_quantize(x, kv_type)
    fill = rng.standard_normal((n_blocks * page, K, hd)).astype(np.float32)  # the other sequences' rows
    pcodes, pscales = kr.kv_quantize(fill, kv_type)
    pcodes[rows] = codes
    if scales is not None:
        pscales[rows] = scales
    pbuf = kr.kv_cache_pack(pcodes, pscales, kv_type)
    got = kr.kv_cache_gather(pbuf, kv_type, n_blocks * page, K, hd, rows)
    assert got.tobytes() == kr.kv_cache_pack(codes, scales, kv_type).tobytes()
    assert [kr.paged_row(table, p, page) for p in range(L)] == rows.tolist()
    for bad in (kr.paged_rows, kr.paged_row):
        with pytest.raises(ValueError):
            bad(table, [len(table) * page] if bad is kr.paged_rows else len(table) * page, page)


def test_decode_splits_cover_and_bound():
    for ms in (1, 5, 33, 64):
        for L in list(range(1, 200)) + [511, 512, 8192, 8193, 32768, 40000]:
            n, per = kr.decode_splits(L, ms)
            assert 1 <= n <= ms and per % kr.DECODE_TILE == 0 and per >= kr.DECODE_TILE
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
    cache.ensure(S)
    cache.k[0, :S], cache.v[0, :S] = keys, vals
    spec = AttentionSpec(H, K, hd, 1e-6, None, 0.2)
    o = NumpyBackend().ops(cache, start, T, 1e-6).attention(q, spec, 0)
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


def test_act_quant_ref_contract():
    """The integer-dot activation quantization: per 32 inputs a power-of-two scale 2^e with
    amax * 2^-e in [64, 128), two int8 levels h, l in [-128, 127], error at most 2^(e-8) (one low
    step where l clamps at 127 just below a half step; the h clamp of amax * 2^-e in [127.5, 128)
    aside), both parts exact in bf16, the high level alone within half a high step, zeros and tiny
    blocks safe, h rounded half up so half steps are exact; bf16 inputs of at least 2^(e-1) exact
    (the bf16-activation contract quantizes bf16 values)."""
    from bw24chat.backends.kernel_refs import act_quant_codes, act_quant_ref, bf16_round

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 32 * 9)) * np.exp(rng.uniform(-20, 20, (6, 9, 1))).repeat(32, -1).reshape(6, -1)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = np.float32(1e-42)
    h, l, e = act_quant_codes(x)
    assert h.dtype == np.int8 and l.dtype == np.int8
    assert h.min() >= -128 and l.min() >= -128
    amax = np.abs(x.reshape(6, 9, 32)).max(-1)
    big = amax > 1e-30
    ratio = amax[big] / np.ldexp(1.0, e[big])
    assert np.all((ratio >= 64) & (ratio < 128))
    step = np.ldexp(1.0, e).repeat(32, -1).reshape(x.shape)
    hi = h * step
    lo = l * step / 256
    assert np.array_equal(bf16_round(hi.astype(np.float32)), hi.astype(np.float32))
    assert np.array_equal(bf16_round(lo.astype(np.float32)), lo.astype(np.float32))
    v = act_quant_ref(x)
    assert np.array_equal(v, (hi + lo).astype(np.float32))
    err = np.abs(v.astype(np.float64) - x)
    clamped = x / step >= 127.5  # the amax element of a block whose amax * 2^-e >= 127.5 (h = 128 clamps)
    assert np.all(err[~clamped] <= step[~clamped] / 256 + 1e-300)  # half a low step; 1/256 where l clamps at 127
    assert np.all(err[clamped] <= step[clamped] / 2)
    assert np.all(np.abs(hi - x) <= step / 2 + 1e-300)  # the high level alone: within half a step
    assert np.all(v[0, :32] == 0)
    t = np.zeros((1, 32), np.float32)
    t[0, :4] = [100.0, 2.5, 3.5, -2.5]  # amax 100 -> e = 0: high codes round half up, the low ones take -1/2
    h, l, _ = act_quant_codes(t)
    assert list(h[0, :4]) == [3 + 97, 3, 4, -2] and list(l[0, :4]) == [0, -128, -128, -128]
    assert np.array_equal(act_quant_ref(t), t)
    xb = bf16_round(x)  # bf16 values of at least 2^(e-1) (8 significant bits from the block's top binade down) are exact
    vb = act_quant_ref(xb)
    stepb = np.ldexp(1.0, act_quant_codes(xb)[2]).repeat(32, -1).reshape(x.shape)  # rounding may raise a block's e
    big_enough = (np.abs(xb) >= stepb / 2) & ~(xb / stepb >= 127.5)
    assert np.array_equal(vb[big_enough], xb[big_enough])


def _linear(backend, x, w):
    """The backend's linear op over the rows of x (no cache involved)."""
    return backend.ops(None, 0, len(x), 1e-6).linear(x, w)


def _product(x, w):
    """x @ w^T as a prefill pass multiplies (numpy_backend.tiled_products)."""
    from bw24chat.backends.numpy_backend import tiled_products

    return tiled_products(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(w, np.float32), np.arange(len(x)))


def test_numpy_backend_act_quant_matrices(monkeypatch):
    """NumpyBackend(act_quant=True) applies the contract to the integer-dot formats only (here
    opted in for Q8_0 and Q4_K, as BW24CHAT_A8 does for the CUDA engine)."""
    monkeypatch.setenv("BW24CHAT_A8", "Q8_0,Q4_K")
    from bw24chat.backends.kernel_refs import act_quant_ref
    from bw24chat.backends.numpy_backend import NumpyBackend
    from bw24chat.synthetic import random_matrix

    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    for fmt, quantized in (("Q8_0", True), ("Q4_K", True), ("Q4_1", False), ("BF16", False)):
        t = random_matrix(fmt, 5, 256, rng)
        B = NumpyBackend(act_quant=True)
        w = B.load_linear([t])
        want = _product(act_quant_ref(x) if quantized else x, t.dequantize())
        assert np.array_equal(_linear(B, x, w), want)
        plain = NumpyBackend()
        assert np.array_equal(_linear(plain, x, plain.load_linear([t])), _product(x, t.dequantize()))


def test_numpy_backend_act_quant_per_format_of_a_fused_matrix():
    """A fused matrix whose formats differ in the integer-dot contract (a K-quant mix's Q5_0 q, k
    beside a Q8_0 v; an interleaved pair too): each tensor's rows take their own format's
    contract, as the CUDA engine's parts do."""
    from bw24chat.backends.kernel_refs import act_quant_ref
    from bw24chat.backends.numpy_backend import NumpyBackend
    from bw24chat.synthetic import random_matrix

    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    xq = act_quant_ref(x)

    def close(got, x_in, t, other):  # near the product under t's contract (BLAS may order it
        # otherwise in a wider matrix), and far from the other contract's
        np.testing.assert_allclose(got, _product(x_in, t.dequantize()), rtol=1e-5, atol=1e-6)
        assert not np.allclose(got, _product(other, t.dequantize()), rtol=1e-5, atol=1e-6)

    q, v = random_matrix("Q5_0", 7, 256, rng), random_matrix("Q8_0", 5, 256, rng)
    B = NumpyBackend(act_quant=True)
    got = _linear(B, x, B.load_linear([q, q, v]))
    close(got[:, :7], x, q, xq)
    close(got[:, 7:14], x, q, xq)
    close(got[:, 14:], xq, v, x)
    g, u = random_matrix("Q5_0", 4, 256, rng), random_matrix("Q8_0", 4, 256, rng)
    got = _linear(B, x, B.load_linear([g, u], interleave=True))
    close(got[:, 0::2], x, g, xq)
    close(got[:, 1::2], xq, u, x)


def test_numpy_backend_bf16_activations():
    """NumpyBackend(act_bf16=True): every product's input rounded to bf16 (ties to even) first,
    then the integer-dot contract where it applies (the CUDA engine's default, common.cuh
    bf16_round); the rounding is the nearest bf16 of each value."""
    from bw24chat.backends.kernel_refs import act_quant_ref, bf16_round
    from bw24chat.backends.numpy_backend import NumpyBackend
    from bw24chat.synthetic import random_matrix

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    xr = bf16_round(x)
    assert np.all((xr.view(np.uint32) & 0xFFFF) == 0)
    ulp = np.ldexp(np.float32(1), np.frexp(np.abs(x))[1] - 8).astype(np.float32)  # bf16's step at |x|
    assert np.all(np.abs(xr - x) <= ulp / 2)
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)  # halfway cases: to the even neighbour
    assert list(bf16_round(ties)) == [1.0, 1 + 2**-6]
    for fmt, quantized in (("Q8_0", True), ("BF16", False)):
        t = random_matrix(fmt, 5, 256, rng)
        B = NumpyBackend(act_quant=True, act_bf16=True)
        want = _product(act_quant_ref(xr) if quantized else xr, t.dequantize())
        assert np.array_equal(_linear(B, x, B.load_linear([t])), want)
