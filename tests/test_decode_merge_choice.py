"""Which split merge decode attention picks (cuda_ops.attn_decode_cluster / attn_decode_hybrid),
checked without a GPU: the measured choices stay wired to the architectures and kernels they were
measured on (docs/performance.md)."""
from bw24chat.backends import cuda_ops as ops


def _arch(monkeypatch, n):
    monkeypatch.setattr(ops, "_arch_number", lambda: n)


def test_hopper_merges_in_clusters(monkeypatch):
    _arch(monkeypatch, 90)
    assert ops.attn_decode_cluster(tc=True) == 8
    assert ops.attn_decode_cluster(tc=False) == 16  # Hopper's non-portable size
    assert ops.attn_decode_hybrid(16) == 4  # 64 tiles = 2048 keys in the cluster, longer rows the workspace


def test_other_cluster_gpus_take_the_portable_size(monkeypatch):
    _arch(monkeypatch, 120)
    assert ops.attn_decode_cluster(tc=True) == 8
    assert ops.attn_decode_cluster(tc=False) == 8
    assert ops.attn_decode_hybrid(8) == 8


def test_no_clusters_before_hopper(monkeypatch):
    _arch(monkeypatch, 89)
    assert ops.attn_decode_cluster(tc=True) == 0
    assert ops.attn_decode_cluster(tc=False) == 0


def test_workspace_has_room_for_a_rounded_hybrid_grid():
    """A hybrid launch rounds max_splits up to a multiple of its cluster (<= 16): the workspace's
    partials are sized for it."""
    for H, K, hd in ((32, 8, 128), (9, 3, 64), (64, 4, 128), (32, 32, 128)):
        ms = ops.attn_decode_max_splits(H, K, n_sm=132)
        ms_ws, _, part = ops._decode_ws_layout(H, K, hd, ops.DECODE_MAX_ROWS, n_sm=132)
        assert ms_ws >= -(-ms // 16) * 16
        assert part >= ops.DECODE_MAX_ROWS * H * ms_ws * (hd + 2) * 4


def test_long_rows_take_whole_clusters():
    """The FMA decode's long rows (attn_decode_long_splits): max_splits rounded up to a whole
    number of clusters, never more splits than the workspace holds."""
    assert ops.attn_decode_long_splits(32, 8, 16, n_sm=132) == 48  # ceil(264 / 8) = 33 -> 48
    for H, K in ((32, 8), (9, 3), (64, 4), (32, 32), (32, 1)):
        ms_ws = ops._decode_ws_layout(H, K, 128, ops.DECODE_MAX_ROWS, n_sm=132)[0]
        for cluster in (8, 16):
            assert ops.attn_decode_long_splits(H, K, cluster, n_sm=132) <= ms_ws


def test_the_workspace_holds_whole_clusters_of_every_size():
    """ATTN_DECODE_TUNING's cluster sizes divide the largest, to which the workspace rounds its
    splits; its blocks per SM are at most the workspace's."""
    from bw24chat.backends.tuning import ATTN_DECODE_TUNING

    for e in ATTN_DECODE_TUNING.values():
        assert e["cluster"] == 0 or ops._WS_CLUSTER % e["cluster"] == 0
        assert e["blocks_per_sm"] <= ops._WS_BLOCKS_PER_SM
