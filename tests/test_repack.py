"""CPU check of the CUDA weight layout: repacked planes decoded by the NumPy mirror of
kernels/formats.cuh (cuda_weights.decode_planes) equal bw24chat.quants.dequantize bit for bit,
for every format, random valid blocks, fused (concatenated) tensors and odd sizes."""
import numpy as np
import pytest

from bw24chat import quants
from bw24chat.backends import cuda_weights as cw
from bw24chat.loaders.tensor import QTensor

FMTS = list(cw.FORMATS)


def random_qtensor(rng, fmt: str, out: int, in_: int, name: str = "w", global_scale: float = 1.0) -> QTensor:
    """Random valid data: random codes, finite random scales (f16 in [1e-3, 1e-1], ue4m3 codes
    that are not NaN, small K-quant sub-scales of every bit pattern, MXFP4 exponents near 2^0)."""
    if fmt == "F32":
        return QTensor(name, fmt, (out, in_), rng.standard_normal((out, in_)).astype(np.float32))
    if fmt == "F16":
        return QTensor(name, fmt, (out, in_), rng.standard_normal((out, in_)).astype(np.float16))
    if fmt == "BF16":
        f = rng.standard_normal((out, in_)).astype(np.float32)
        return QTensor(name, fmt, (out, in_), (f.view(np.uint32) >> 16).astype(np.uint16))
    T = quants.T[fmt]
    bs, ts = quants.block_info(T)
    nb = out * in_ // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    f16 = lambda n: (rng.uniform(1e-3, 1e-1, n) * rng.choice([-1, 1], n)).astype(np.float16).view(np.uint8).reshape(n, 2)  # noqa: E731
    if fmt in ("Q8_0", "Q4_0", "Q5_0"):
        b[:, 0:2] = f16(nb)
    elif fmt in ("Q4_1", "Q5_1"):
        b[:, 0:2], b[:, 2:4] = f16(nb), f16(nb)
    elif fmt in ("Q4_K", "Q5_K"):
        b[:, 0:2], b[:, 2:4] = f16(nb), f16(nb)
    elif fmt == "Q6_K":
        b[:, 208:210] = f16(nb)
    elif fmt == "Q2_K":
        b[:, 80:82], b[:, 82:84] = f16(nb), f16(nb)
    elif fmt == "Q3_K":
        b[:, 108:110] = f16(nb)
    elif fmt == "NVFP4":
        s = rng.integers(0, 0x7F, size=(nb, 4), dtype=np.uint8)  # 0x7F is NaN in E4M3
        s[rng.random((nb, 4)) < 0.05] = 0x7F  # ... which decodes to 0: cover it
        s[rng.random((nb, 4)) < 0.05] |= 0x80  # bit 7, which the reference ignores (0xFF reads as 0x7F's 240)
        b[:, 0:4] = s
    elif fmt == "MXFP4":  # e8m0 exponents around 2^0, and the two subnormal-scale codes 0, 1
        e = rng.integers(112, 136, size=nb, dtype=np.uint8)
        e[rng.random(nb) < 0.05] = rng.integers(0, 2, dtype=np.uint8)
        b[:, 0] = e
    return QTensor(name, fmt, (out, in_), b.reshape(out, -1), global_scale=global_scale)


def reference(ts: list) -> np.ndarray:
    return np.concatenate([t.dequantize() for t in ts], axis=0)


@pytest.mark.parametrize("fmt", FMTS)
def test_repack_round_trip_bit_exact(fmt):
    rng = np.random.default_rng()
    bs = max(quants.block_info(quants.T[fmt])[0] if fmt not in ("F32", "F16", "BF16") else 1, cw.vpc(fmt))
    in_ = bs * int(rng.integers(1, 5))
    gs = [1.0, 1.0, 1.0] if fmt != "NVFP4" else [0.75, 1.0, 3.0e-3]
    ts = [random_qtensor(rng, fmt, int(n), in_, f"w{i}", gs[i]) for i, n in enumerate(rng.integers(1, 9, 3))]
    hp = cw.repack_host(ts)
    assert hp.out == sum(t.shape[0] for t in ts) and hp.q.shape == (hp.out, in_ // cw.vpc(fmt) * cw.q_chunk_bytes(fmt))
    got, ref = cw.decode_planes(hp), reference(ts)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"{np.sum(got.view(np.uint32) != ref.view(np.uint32))} bit mismatches"


def test_mxfp4_every_scale_byte():
    """MXFP4's e8m0 byte decodes bit for bit whatever it is (formats.cuh e8m0_half: the
    subnormals of codes 0 and 1, the overflow of 255 x 6 to inf)."""
    rng = np.random.default_rng(0)
    t = random_qtensor(rng, "MXFP4", 256, 32)
    t.raw.reshape(256, 17)[:, 0] = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):  # 2^127 x 6 is inf on both sides
        got, ref = cw.decode_planes(cw.repack_host([t])), t.dequantize()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_repack_rejects_mixed_formats():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        cw.repack_host([random_qtensor(rng, "Q8_0", 2, 32), random_qtensor(rng, "Q4_0", 2, 32)])


def test_format_runs_split_a_fused_matrix_by_format():
    """A fused matrix in several formats (llama.cpp's Q4_K_M: q, k Q4_K, v Q6_K) becomes runs of
    one format, in order, one DeviceWeight each (PartedWeight); an interleaved gate/up pair in two
    formats is refused by name."""
    rng = np.random.default_rng(0)
    q, k, v = (random_qtensor(rng, f, 2, 256) for f in ("Q4_K", "Q4_K", "Q6_K"))
    for t, n in zip((q, k, v), "qkv"):
        t.name = n
    assert [[t.name for t in r] for r in cw.format_runs([q, k, v])] == [["q", "k"], ["v"]]
    assert [[t.name for t in r] for r in cw.format_runs([v, q, k, v])] == [["v"], ["q", "k"], ["v"]]
    assert len(cw.format_runs([q, k])) == 1
    with pytest.raises(ValueError, match="q Q4_K, v Q6_K"):
        cw.format_runs([q, v], interleave=True)


def test_nibble_chunk_layout():
    codes = np.arange(32, dtype=np.uint8) % 16
    b = cw.pack_nibbles(codes)
    assert list(b & 15) == list(codes[:16]) and list(b >> 4) == list(codes[16:])


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K", "Q6_K", "NVFP4", "Q5_1", "MXFP4", "Q2_K", "Q3_K"])
def test_repack_interleaved_rows(fmt):
    """interleave=True (the fused gate/up matrix): row 2i = tensor 0 row i, row 2i+1 = tensor 1
    row i, every plane (codes, scales, highs, NVFP4 per-row global scale) interleaved alike."""
    rng = np.random.default_rng()
    bs = max(quants.block_info(quants.T[fmt])[0] if fmt not in ("F32", "F16", "BF16") else 1, cw.vpc(fmt))
    in_, n = bs * int(rng.integers(1, 4)), int(rng.integers(1, 7))
    gs = [0.5, 3.0e-2] if fmt == "NVFP4" else [1.0, 1.0]
    ts = [random_qtensor(rng, fmt, n, in_, f"w{i}", gs[i]) for i in range(2)]
    hp = cw.repack_host(ts, interleave=True)
    got = cw.decode_planes(hp)
    ref = np.stack([ts[0].dequantize(), ts[1].dequantize()], axis=1).reshape(2 * n, in_)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    with pytest.raises(ValueError):
        cw.repack_host([ts[0], random_qtensor(rng, fmt, n + 1, in_, "w2")], interleave=True)


@pytest.mark.parametrize("fmt", sorted(cw.FORMATS))
def test_plane_shapes_are_repack_hosts(fmt):
    """plane_shapes (what upload allocates before the GPU repacks into it, and what a plan
    records) names the planes repack_host makes, in PLANES order, with their shapes and dtypes."""
    rng = np.random.default_rng(4)
    bs = max(quants.block_info(quants.T[fmt])[0] if fmt not in ("F32", "F16", "BF16") else 1, cw.vpc(fmt))
    rows, in_ = 3, 2 * bs
    t = random_qtensor(rng, fmt, rows, in_, "w")
    hp = cw.repack_host([t])
    got = {name: (tuple(getattr(hp, name).shape), getattr(hp, name).dtype) for name in cw.PLANES if getattr(hp, name) is not None}
    want = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in cw.plane_shapes(fmt, rows, in_).items()}
    assert list(got) == list(want) and got == want
    assert cw.raw_row_bytes(fmt, in_) * rows == np.ascontiguousarray(t.raw).nbytes
