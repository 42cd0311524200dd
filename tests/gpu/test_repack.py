"""kernels/repack.cu: a checkpoint's blocks repacked on the GPU, byte for byte repack_host's
planes, in every format: a matrix as upload makes it (one tensor, several concatenated, several
interleaved; odd row counts), and an expert image (the load's slots, the host tier, the file
tier) at widths of one block and of several, with per-expert NVFP4 global scales and the bytes
around the image kept."""
import numpy as np
import pytest

from bw24chat.backends import cuda_moe
from bw24chat.backends import cuda_weights as cw
from bw24chat.backends.cuda_weights import repack_host

K_BLOCK = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K")


@pytest.mark.parametrize("fmt", [f for f in cuda_moe.FORMATS if f != "F32"])  # F32: BF16's plain copy, no generator
def test_repack_on_device_is_the_host_image(cp, fmt):
    from bw24chat.loaders.tensor import ExpertTensor
    from bw24chat.synthetic import random_experts

    rng = np.random.default_rng()
    for E, F, D in ((3, 256, 512), (2, 256, 768) if fmt in K_BLOCK else (2, 128, 192 if fmt != "NVFP4" else 256)):
        g, u, d = (ExpertTensor(n, random_experts(fmt, E, r, c, rng)) for n, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
        if fmt == "NVFP4":  # a global scale per expert and tensor
            for i, t in enumerate((g, u, d)):
                for e, p in enumerate(t.parts):
                    p.global_scale = np.float32(0.5 + e + 0.25 * i)
        gu_lay, dn_lay, _ = cuda_moe.expert_layouts(g, u, d)
        src = cuda_moe.ExpertSource(g, u, d, gu_lay, dn_lay, dn_lay.end)
        for e in range(E):
            want = src.image(e, np.zeros(dn_lay.end, np.uint8))
            for hp, lay in ((repack_host([g.parts[e], u.parts[e]], interleave=True), gu_lay), (repack_host([d.parts[e]]), dn_lay)):
                for name, off, sh, dt in lay.planes:
                    a = getattr(hp, name)
                    assert np.array_equal(want[off:off + a.nbytes], a.reshape(-1).view(np.uint8)), (fmt, e, name)
            raw = np.zeros(src.raw_bytes, np.uint8)
            src.raw_into(e, raw)
            dev_raw = cp.asarray(raw)
            img = cp.full(dn_lay.end + 512, 0xAB, cp.uint8)  # the image at byte 256, guard bytes around it
            src.repack_on_device(e, int(dev_raw.data.ptr), int(img.data.ptr) + 256)
            got = img.get()
            assert (got[:256] == 0xAB).all() and (got[256 + dn_lay.end:] == 0xAB).all(), (fmt, e)
            for lay in (gu_lay, dn_lay):
                for name, off, sh, dt in lay.planes:
                    n = int(np.prod(sh)) * np.dtype(dt).itemsize
                    assert np.array_equal(got[256 + off:256 + off + n], want[off:off + n]), (fmt, (E, F, D), e, name)


@pytest.mark.parametrize("fmt", sorted(cw.FORMATS))
@pytest.mark.parametrize("chunk", [1, 64 << 20])
def test_upload_is_repack_hosts_planes(cp, fmt, chunk, monkeypatch):
    """upload (every weight the loader reads): the device planes equal repack_host's, for one
    tensor, three concatenated (odd row counts) and two interleaved (the fused gate|up); whole
    tensors at once and a row at a time (UPLOAD_CHUNK: the raw scratch reused piece by piece)."""
    from tests.test_repack import random_qtensor

    monkeypatch.setattr(cw, "UPLOAD_CHUNK", chunk)
    rng = np.random.default_rng()
    bs = max(1 if fmt in ("F32", "F16", "BF16") else cw.quants.block_info(cw.quants.T[fmt])[0], cw.vpc(fmt))
    in_ = bs * int(rng.integers(1, 4))
    gs = (0.5, 3.0e-2, 2.0) if fmt == "NVFP4" else (1.0, 1.0, 1.0)
    for rows, inter in (((7,), False), ((5, 1, 3), False), ((4, 4), True)):
        ts = [random_qtensor(rng, fmt, r, in_, f"w{i}", gs[i]) for i, r in enumerate(rows)]
        w = cw.upload(ts, interleave=inter)
        hp = repack_host(ts, inter)
        for name in cw.PLANES:
            want, got = getattr(hp, name), getattr(w, name)
            assert (want is None) == (got is None), (fmt, rows, name)
            if want is not None:
                assert np.array_equal(got.get(), want), (fmt, rows, inter, name)
        assert (w.out, w.in_, w.fmt, w.nbytes) == (hp.out, hp.in_, hp.fmt, sum(a.nbytes for a in (hp.q, hp.h, hp.s, hp.d, hp.gscale) if a is not None))
        scales = tuple(float(t.global_scale) for t in ts)
        assert w.global_scale == ((scales[0] if len(set(scales)) == 1 else scales) if fmt == "NVFP4" else 1.0)
