"""kernels/repack.cu: an expert's tensors as the checkpoint holds them, repacked on the GPU into
its image (the expert file tier's path), byte for byte the image the host builds
(cuda_weights.repack_host's planes, ExpertSource.image) in every expert format, at widths of
one block and of several, with per-expert NVFP4 global scales and bytes around the image kept."""
import numpy as np
import pytest

from bw24chat.backends import cuda_moe
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
        probe = cuda_moe.ExpertSource(g, u, d, None, None, 0)
        gu_lay = cuda_moe._place(probe.planes(0)[0], 0)
        dn_lay = cuda_moe._place(probe.planes(0)[1], gu_lay.end)
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
