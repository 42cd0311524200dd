"""CPU side of the CUDA MoE path (backends/cuda_moe.py): launch planning and format refusal, and
the router reference's summation tree (numpy_backend.warp_sum_rows, moe_router.cu's order)."""
import numpy as np
import pytest

from bw24chat.backends import cuda_moe
from bw24chat.backends.numpy_backend import warp_sum_rows


@pytest.mark.parametrize("F,m,k,want", [(768, 1, 8, 4), (768, 8, 8, 8), (32, 1, 3, 1), (1536, 1, 8, 8), (96, 4, 3, 1)])
def test_gu_split(F, m, k, want):
    kper = cuda_moe.gu_split(F, m, k, sms=132)
    assert kper == want and k % kper == 0
    assert kper == 1 or -(-F // cuda_moe.NW) * m * (k // kper) >= 2 * 132


def test_shared_memory_plans():
    assert cuda_moe.gu_smem("BF16", 2048) == 4 * 2048 + 4 * cuda_moe.NW
    assert cuda_moe.down_smem("Q8_0", 768, 8) == 4 * 8 * 1024  # F padded to whole warp tiles (32 x 16 values)
    assert cuda_moe.down_smem("NVFP4", 1408, 8) <= cuda_moe.SMEM_MAX  # GLM-4.5's expert width


def test_formats_refused_by_name():
    with pytest.raises(NotImplementedError, match="MXFP4"):
        cuda_moe.check_format("MXFP4", 768, 2048)
    with pytest.raises(NotImplementedError, match="Q8_0.*expert width 48"):
        cuda_moe.check_format("Q8_0", 48, 2048)
    cuda_moe.check_format("NVFP4", 768, 2048)


def test_warp_sum_rows_is_the_butterfly_of_lane_sums():
    rng = np.random.default_rng(0)
    v = rng.random((5, 160)).astype(np.float32)
    got = warp_sum_rows(v)
    lanes = [np.float32(0)] * 32
    for e in range(160):
        lanes[e % 32] = np.float32(lanes[e % 32] + v[0, e])
    for o in (16, 8, 4, 2, 1):
        lanes = [np.float32(lanes[i] + lanes[i + o]) for i in range(o)]
    assert got[0] == lanes[0]
    np.testing.assert_allclose(got, v.sum(-1), rtol=1e-6)
