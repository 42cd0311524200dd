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


def _prologue(cp, qkv, H, K, hd, qw, kw, t, pos, style, kv_type, N, qk_norm, bias=None):
    """One qk_norm_rope_kv_write over the column slices of a fused (T, (H + 2K) hd) qkv buffer, as
    the runner calls it: the rotated q (q_out), the k and v slices after the call, and the caches."""
    T = len(qkv)
    d = cp.asarray(qkv)
    q, k, v = (d[:, a * hd:b * hd].reshape(T, b - a, hd) for a, b in ((0, H), (H, H + K), (H + K, H + 2 * K)))
    q_out = cp.full((T, H, hd), np.nan, cp.float32)
    ck = cv = None
    if kv_type is not None:
        ck, cv = ops.kv_cache_alloc(kv_type, N, K, hd), ops.kv_cache_alloc(kv_type, N, K, hd)
        ck.view(cp.uint8).fill(0xAB)
        cv.view(cp.uint8).fill(0xAB)
    ops.qk_norm_rope_kv_write(q, k, v, cp.asarray(qw), cp.asarray(kw), 1e-6, cp.asarray(t.cos), cp.asarray(t.sin),
                              cp.asarray(pos), style, t.rot_dim, ck, cv, kv_type, q_out=q_out, qk_norm=qk_norm,
                              bias=None if bias is None else cp.asarray(bias))
    return q_out.get(), k.get(), v.get(), ck, cv


# MiniMax-M2's attention (H 48, K 8, hd 128, rotary 64: 4 slots per warp), odd head counts and a
# rotary half that is no multiple of 32, a last warp with idle slots (50 slots = 13 warps x 4)
@pytest.mark.parametrize("H,K,hd,partial", [(48, 8, 128, 0.5), (11, 3, 96, 0.5), (40, 5, 64, 1.0), (3, 1, 256, 0.75)])
@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize("kv_type", ["bf16", "f32"])
def test_full_qk_norm_rope_kv_write(cp, rng, H, K, hd, partial, style, kv_type):
    """QK-norm over the whole q (H hd) and k (K hd) rows: bit-equal to kernel_refs.qk_norm_ref then
    apply_rope, within float32 rounding of the NumPy backend's RMSNorm, k and v cached."""
    T, N = 13, 200
    t = _table(hd, partial, style, N + 16)
    pos = rng.choice(N, T, replace=False).astype(np.int32)
    pos[-1] = N + 3  # beyond the cache: not written
    scale = rng.uniform(0.1, 20, (T, 1)).astype(np.float32)  # rows of very different magnitudes
    qkv = (rng.standard_normal((T, (H + 2 * K) * hd)) * scale).astype(np.float32)
    qw = rng.uniform(0.5, 1.5, H * hd).astype(np.float32)
    kw = rng.uniform(0.5, 1.5, K * hd).astype(np.float32)
    bias = (rng.standard_normal((H + 2 * K) * hd) * 0.1).astype(np.float32)
    q_out, k_out, v_out, ck, cv = _prologue(cp, qkv, H, K, hd, qw, kw, t, pos, style, kv_type, N, "full", bias)
    x = qkv + bias
    q, k, v = x[:, :H * hd].reshape(T, H, hd), x[:, H * hd:(H + K) * hd].reshape(T, K, hd), x[:, (H + K) * hd:]
    want_q = apply_rope(kr.qk_norm_ref(q, qw, 1e-6, full=True), pos, t)
    want_k = apply_rope(kr.qk_norm_ref(k, kw, 1e-6, full=True), pos, t)
    assert np.array_equal(q_out.view(np.uint32), want_q.view(np.uint32))
    assert np.array_equal(k_out.view(np.uint32), want_k.view(np.uint32))
    assert np.array_equal(v_out.reshape(T, -1).view(np.uint32), v.view(np.uint32))  # the biased v, stored back
    # the contract is the NumPy backend's RMSNorm over the whole projection (sums in another order)
    ref_q = apply_rope(rmsnorm_ref(q.reshape(T, -1), qw, 1e-6).reshape(T, H, hd), pos, t)
    np.testing.assert_allclose(q_out, ref_q, rtol=1e-5, atol=1e-5)
    for cache, src in ((ck, k_out), (cv, v_out)):
        codes, _ = kr.kv_cache_unpack(cache.get(), kv_type, N, K, hd)
        ref_codes, _ = kr.kv_quantize(src[:-1], kv_type)
        assert np.array_equal(codes[pos[:-1]].view(np.uint8), np.asarray(ref_codes).view(np.uint8))
        assert np.all(codes[np.setdiff1d(np.arange(N), pos[:-1])].view(np.uint8) == 0xAB)


@pytest.mark.parametrize("qk_norm,H,K,hd", [("full", 48, 8, 128), ("full", 9, 3, 64), ("head", 16, 4, 128)])
def test_qk_norm_rows_independent_of_T(cp, rng, qk_norm, H, K, hd):
    """A decode step's rows (T = 1 .. 8) and a prefill chunk's rows come out bit for bit the same."""
    T = 37
    t = _table(hd, 0.5, "neox", 4096)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    qkv = (rng.standard_normal((T, (H + 2 * K) * hd)) * 3).astype(np.float32)
    n = (H, K) if qk_norm == "full" else (1, 1)
    qw, kw = (rng.uniform(0.5, 1.5, m * hd).astype(np.float32) for m in n)
    full = _prologue(cp, qkv, H, K, hd, qw, kw, t, pos, "neox", None, 0, qk_norm)
    for a, b in ((0, 1), (5, 8), (29, 37)):
        part = _prologue(cp, qkv[a:b], H, K, hd, qw, kw, t, pos[a:b], "neox", None, 0, qk_norm)
        for x, y in zip(full[:2], part[:2]):
            assert np.array_equal(x[a:b].view(np.uint32), y.view(np.uint32)), (a, b)
    want = apply_rope(kr.qk_norm_ref(qkv[:, :H * hd].reshape(T, H, hd), qw, 1e-6, qk_norm == "full"), pos, t)
    assert np.array_equal(full[0].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("H,K,hd,world", [(48, 8, 128, 2), (48, 8, 128, 4), (12, 4, 64, 2)])
def test_full_qk_norm_split_by_heads(cp, rng, H, K, hd, world):
    """MiniMax-M2's whole-projection QK-norm with the heads split over GPUs (cuda_sharded.py): each
    GPU's ss_mode 1 sums (its heads left to right), added in rank order (the all-reduce's
    numpy_sharded.reduce_ranks), then ss_mode 2 on each GPU: its q and k bit for bit the
    normalization by those totals over the model's H hd and K hd, then the rotation."""
    from bw24chat.backends.numpy_sharded import reduce_ranks

    T = 9
    t = _table(hd, 0.5, "neox", 4096)
    pos = cp.asarray(rng.integers(0, 4096, T).astype(np.int32))
    x = (rng.standard_normal((T, (H + 2 * K) * hd)) * rng.uniform(0.1, 20, (T, 1))).astype(np.float32)
    qw = rng.uniform(0.5, 1.5, H * hd).astype(np.float32)
    kw = rng.uniform(0.5, 1.5, K * hd).astype(np.float32)
    q, k = x[:, :H * hd].reshape(T, H, hd), x[:, H * hd:(H + K) * hd].reshape(T, K, hd)
    v = x[:, (H + K) * hd:].reshape(T, K, hd)
    h, kh = H // world, K // world
    ranks = [(q[:, r * h:(r + 1) * h], k[:, r * kh:(r + 1) * kh], v[:, r * kh:(r + 1) * kh],
              qw[r * h * hd:(r + 1) * h * hd], kw[r * kh * hd:(r + 1) * kh * hd]) for r in range(world)]

    def launch(r, mode, ss):
        qr, kr_, vr, qwr, kwr = ranks[r]
        qd, kd, vd = (cp.asarray(np.ascontiguousarray(a)) for a in (qr, kr_, vr))
        q_out = cp.full((T, h, hd), np.nan, cp.float32)
        ops.qk_norm_rope_kv_write(qd, kd, vd, cp.asarray(qwr), cp.asarray(kwr), 1e-6, cp.asarray(t.cos),
                                  cp.asarray(t.sin), pos, "neox", t.rot_dim, None, None, None, q_out=q_out,
                                  qk_norm="full", split_ss=(ss, mode, H, K))
        return q_out.get(), kd.get()

    partial = []
    for r in range(world):
        ss = cp.full((T, 2), np.nan, cp.float32)
        launch(r, 1, ss)
        partial.append(ss.get())
    total = reduce_ranks(partial)
    got = [launch(r, 2, cp.asarray(total)) for r in range(world)]

    def left_to_right(a):  # a GPU's sum over its heads, as rope.cu adds them
        s = kr.head_sum_sq(a)
        tot = np.zeros(T, np.float32)
        for j in range(s.shape[1]):
            tot = tot + s[:, j]
        return tot

    for c, (xs, n, w) in enumerate(((q, H, qw), (k, K, kw))):
        parts = [left_to_right(rk[c]) for rk in ranks]
        assert np.array_equal(total[:, c].view(np.uint32), reduce_ranks(parts).view(np.uint32))
        inv = np.float32(1.0) / np.sqrt(total[:, c] / np.float32(n * hd) + np.float32(1e-6))
        want = apply_rope((xs * inv[:, None, None]) * w.reshape(n, hd), cp.asnumpy(pos), t)
        have = np.concatenate([g[c] for g in got], axis=1)
        assert np.array_equal(have.view(np.uint32), want.view(np.uint32)), c
