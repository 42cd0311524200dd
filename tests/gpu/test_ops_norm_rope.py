"""norm.cu and rope.cu against the NumPy references (numpy_backend.rmsnorm_ref,
kernel_refs.rmsnorm_concat_ref, rope.apply_rope, kernel_refs.kv_quantize).  Fresh random inputs
every run; outputs poisoned with NaN first."""
import numpy as np
import pytest

from bw24chat.backends import cuda_ops as ops
from bw24chat.backends import kernel_refs as kr
from bw24chat.backends.numpy_backend import rmsnorm_ref
from bw24chat.rope import apply_rope, build_rope_table



@pytest.mark.parametrize("T,D", [(1, 64), (7, 576), (5, 4096), (3, 2052), (2, 12288)])
def test_rmsnorm(cp, rng, T, D):
    x = (rng.standard_normal((T, D)) * rng.uniform(0.1, 10)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    out = cp.full((T, D), np.nan, cp.float32)
    ops.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-6, out)
    np.testing.assert_allclose(out.get(), rmsnorm_ref(x, w, 1e-6), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("T,D", [(1, 576), (9, 4096), (2, 12288)])
def test_add_rmsnorm(cp, rng, T, D):
    x = rng.standard_normal((T, D)).astype(np.float32)
    r = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    rd, out = cp.asarray(r), cp.full((T, D), np.nan, cp.float32)
    ops.add_rmsnorm(cp.asarray(x), rd, cp.asarray(w), 1e-5, out)
    assert np.array_equal(rd.get(), r + x)
    np.testing.assert_allclose(out.get(), rmsnorm_ref(r + x, w, 1e-5), rtol=2e-6, atol=1e-6)


def test_rmsnorm_rows_independent_of_T(cp, rng):
    x = rng.standard_normal((8, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    full, one = cp.empty((8, 4096), cp.float32), cp.empty((1, 4096), cp.float32)
    xd = cp.asarray(x)
    ops.rmsnorm(xd, cp.asarray(w), 1e-6, full)
    ops.rmsnorm(xd[5:6], cp.asarray(w), 1e-6, one)
    assert np.array_equal(full.get()[5], one.get()[0])


@pytest.mark.parametrize("T,Da,Db", [(1, 64, 64), (3, 576, 576), (9, 4096, 4096), (2, 2052, 12), (5, 12, 8192)])
@pytest.mark.parametrize("norms", ["both", "a", "b", "neither"])
def test_rmsnorm_concat(cp, rng, T, Da, Db, norms):
    """norm.cu rmsnorm_concat against kernel_refs.rmsnorm_concat_ref; each normed half equals the
    rmsnorm kernel's output bit for bit (the same reduction order)."""
    xa = (rng.standard_normal((T, Da)) * rng.uniform(0.1, 10)).astype(np.float32)
    xb = (rng.standard_normal((T, Db)) * rng.uniform(0.1, 10)).astype(np.float32)
    wa = rng.standard_normal(Da).astype(np.float32) if norms in ("both", "a") else None
    wb = rng.standard_normal(Db).astype(np.float32) if norms in ("both", "b") else None
    dev = lambda w: None if w is None else cp.asarray(w)  # noqa: E731
    out = cp.full((T, Da + Db), np.nan, cp.float32)
    ops.rmsnorm_concat(cp.asarray(xa), dev(wa), cp.asarray(xb), dev(wb), 1e-6, out)
    got = out.get()
    np.testing.assert_allclose(got, kr.rmsnorm_concat_ref(xa, wa, xb, wb, 1e-6), rtol=2e-6, atol=1e-6)
    for x, w, part in ((xa, wa, got[:, :Da]), (xb, wb, got[:, Da:])):
        if w is None:
            assert np.array_equal(part.view(np.uint32), x.view(np.uint32))
        else:
            one = cp.empty(x.shape, cp.float32)
            ops.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-6, one)
            assert np.array_equal(part.view(np.uint32), one.get().view(np.uint32))


def _table(hd, partial, style, n_pos=4096):
    t = build_rope_table(hd, partial, 1e6, None, n_pos, style, n_pos)
    return t


@pytest.mark.parametrize("hd,partial", [(64, 1.0), (128, 1.0), (128, 0.5), (64, 0.75)])
@pytest.mark.parametrize("style", ["neox", "normal"])
def test_rope_bit_exact(cp, rng, hd, partial, style):
    T, H, K = 5, 6, 2
    t = _table(hd, partial, style)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((T, K, hd)).astype(np.float32)
    v = rng.standard_normal((T, K, hd)).astype(np.float32)
    qd, kd = cp.asarray(q), cp.asarray(k)
    ops.qk_norm_rope_kv_write(qd, kd, cp.asarray(v), None, None, 1e-6, cp.asarray(t.cos), cp.asarray(t.sin),
                              cp.asarray(pos), style, t.rot_dim, None, None, None)
    assert np.array_equal(qd.get(), apply_rope(q, pos, t))
    assert np.array_equal(kd.get(), apply_rope(k, pos, t))


@pytest.mark.parametrize("kv_type", kr.KV_TYPES)
@pytest.mark.parametrize("hd,H,K,qk_norm", [(64, 9, 3, False), (128, 16, 8, True), (128, 32, 4, True)])
def test_fused_norm_rope_kv_write(cp, rng, kv_type, hd, H, K, qk_norm):
    T, N = 7, 300
    t = _table(hd, 1.0, "neox", N + 16)  # the table covers the out-of-cache position too
    pos = rng.choice(N, T, replace=False).astype(np.int32)
    pos[-1] = N + 5  # beyond the cache: must not be written (and must not crash)
    q = (rng.standard_normal((T, H, hd)) * 3).astype(np.float32)
    k = (rng.standard_normal((T, K, hd)) * 3).astype(np.float32)
    v = rng.standard_normal((T, K, hd)).astype(np.float32)
    v[0, 0, :] = 0.0  # an all-zero vector: scale 0
    qw = rng.uniform(0.5, 1.5, hd).astype(np.float32) if qk_norm else None
    kw = rng.uniform(0.5, 1.5, hd).astype(np.float32) if qk_norm else None
    ck, cv = ops.kv_cache_alloc(kv_type, N, K, hd), ops.kv_cache_alloc(kv_type, N, K, hd)
    ck.view(cp.uint8).fill(0xAB)
    cv.view(cp.uint8).fill(0xAB)
    qd, kd, vd = cp.asarray(q), cp.asarray(k), cp.asarray(v)
    ops.qk_norm_rope_kv_write(qd, kd, vd, None if qw is None else cp.asarray(qw), None if kw is None else cp.asarray(kw),
                              1e-6, cp.asarray(t.cos), cp.asarray(t.sin), cp.asarray(pos), "neox", t.rot_dim,
                              ck, cv, kv_type)
    qn = rmsnorm_ref(q, qw, 1e-6) if qk_norm else q
    kn = rmsnorm_ref(k, kw, 1e-6) if qk_norm else k
    q_out, k_out = qd.get(), kd.get()
    np.testing.assert_allclose(q_out, apply_rope(qn, pos, t), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_out, apply_rope(kn, pos, t), rtol=1e-5, atol=1e-5)
    assert np.array_equal(vd.get(), v)
    for cache, src in ((ck, k_out), (cv, v)):
        codes, scales = kr.kv_cache_unpack(cache.get(), kv_type, N, K, hd)
        ref_codes, ref_scales = kr.kv_quantize(src[:-1], kv_type)  # the kernel quantizes what it wrote
        assert np.array_equal(codes[pos[:-1]].view(np.uint8), np.asarray(ref_codes).view(np.uint8))
        if scales is not None:
            assert np.array_equal(scales[pos[:-1]].view(np.uint8), np.asarray(ref_scales).view(np.uint8))
        untouched = np.setdiff1d(np.arange(N), pos[:-1])
        assert np.all(codes[untouched].view(np.uint8) == 0xAB)
