"""Which split merge decode attention picks (cuda_ops.attn_decode_cluster / attn_decode_hybrid),
checked without a GPU: the measured choices (docs/performance.md) stay wired to
the architectures and kernels they were measured on, and the switches override them."""
import pytest

from bw24chat.backends import cuda_ops as ops


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("BW24CHAT_ATTN_CLUSTER", "BW24CHAT_ATTN_HYBRID"):
        monkeypatch.delenv(k, raising=False)


def _arch(monkeypatch, n):
    monkeypatch.setattr(ops, "_arch_number", lambda: n)


def test_hopper_merges_in_clusters(monkeypatch):
    _arch(monkeypatch, 90)
    assert ops.attn_decode_cluster(tc=True) == 8
    assert ops.attn_decode_cluster(tc=False) == 16  # Hopper's non-portable size
    assert ops.attn_decode_hybrid(16) == 4  # 64 tiles = 2048 keys in the cluster, longer rows the workspace
    assert ops.attn_decode_hybrid(8, tc=True) == 0  # measured slower (twenty-first session): the cluster always


def test_other_cluster_gpus_take_the_portable_size(monkeypatch):
    _arch(monkeypatch, 120)
    assert ops.attn_decode_cluster(tc=True) == 8
    assert ops.attn_decode_cluster(tc=False) == 8
    assert ops.attn_decode_hybrid(8) == 8


def test_no_clusters_before_hopper(monkeypatch):
    _arch(monkeypatch, 89)
    assert ops.attn_decode_cluster(tc=True) == 0
    assert ops.attn_decode_cluster(tc=False) == 0
    monkeypatch.setenv("BW24CHAT_ATTN_CLUSTER", "8")
    assert ops.attn_decode_cluster(tc=True) == 0


def test_switches_override(monkeypatch):
    _arch(monkeypatch, 90)
    monkeypatch.setenv("BW24CHAT_ATTN_CLUSTER", "0")
    assert ops.attn_decode_cluster(tc=True) == 0 and ops.attn_decode_cluster(tc=False) == 0
    monkeypatch.setenv("BW24CHAT_ATTN_CLUSTER", "16")
    assert ops.attn_decode_cluster(tc=True) == 16
    monkeypatch.setenv("BW24CHAT_ATTN_CLUSTER", "5")
    with pytest.raises(ValueError):
        ops.attn_decode_cluster(tc=True)
    monkeypatch.setenv("BW24CHAT_ATTN_HYBRID", "0")
    assert ops.attn_decode_hybrid(16) == 0


def test_workspace_has_room_for_a_rounded_hybrid_grid():
    """A hybrid launch rounds max_splits up to a multiple of its cluster (<= 16): the workspace's
    partials are sized for it."""
    for H, K, hd in ((32, 8, 128), (9, 3, 64), (64, 4, 128), (32, 32, 128)):
        ms = ops.attn_decode_max_splits(H, K, n_sm=132)
        ms_ws, _, part = ops._decode_ws_layout(H, K, hd, ops.DECODE_MAX_ROWS, n_sm=132)
        assert ms_ws >= -(-ms // 16) * 16
        assert part >= ops.DECODE_MAX_ROWS * H * ms_ws * (hd + 2) * 4


def test_tensor_core_long_rows_fill_one_wave(monkeypatch):
    """The tensor-core decode's long rows (attn_decode_long_splits): as many blocks as one wave
    holds at one row (one 139 KB block per SM with two halves, two with one), a whole number of
    clusters, at least one cluster; never more splits than the workspace holds.  The FMA
    kernel's: max_splits rounded up to clusters, as before."""
    monkeypatch.delenv("BW24CHAT_ATTN_SPLITS", raising=False)
    assert ops.attn_decode_long_splits(32, 8, 8, True, 2, n_sm=132) == 16  # 128 blocks, not 17 x 8 = 136
    assert ops.attn_decode_long_splits(32, 8, 8, True, 1, n_sm=132) == 32  # two blocks per SM
    assert ops.attn_decode_long_splits(32, 4, 8, True, 2, n_sm=132) == 32  # Qwen3-30B-A3B: 4 kv heads
    assert ops.attn_decode_long_splits(64, 4, 8, True, 2, n_sm=132) == 16  # two head groups per kv head
    assert ops.attn_decode_long_splits(32, 32, 8, True, 2, n_sm=132) == 8  # one cluster at least
    assert ops.attn_decode_long_splits(32, 8, 16, False, n_sm=132) == 48  # ceil(264 / 8) = 33 -> 48
    for H, K in ((32, 8), (9, 3), (64, 4), (32, 32), (32, 1)):
        ms_ws = ops._decode_ws_layout(H, K, 128, ops.DECODE_MAX_ROWS, n_sm=132)[0]
        for halves in (1, 2):
            assert ops.attn_decode_long_splits(H, K, 8, True, halves, n_sm=132) <= ms_ws
    monkeypatch.setenv("BW24CHAT_ATTN_SPLITS", "12")
    assert ops.attn_decode_long_splits(32, 8, 8, True, 2, n_sm=132) == 16  # forced, rounded up to clusters
