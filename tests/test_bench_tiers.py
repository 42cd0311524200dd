"""bench's spilled-expert row (bench._tier_row): the file tier's bytes split into what storage
served (charged at the disk's measured rate) and what the page cache served (charged as host
bytes), so a row's bound never assumes storage reads that the kernel did not make."""
import os

import pytest

from bw24chat import bench
from bw24chat.backends.expert_tiers import ExpertStats


def test_storage_bytes_are_charged_at_the_disk_rate_the_rest_as_host_bytes():
    before = vars(ExpertStats()).copy()  # the timed window starts at zero
    st = ExpertStats(vram_hits=900, host_hits=20, disk_hits=80, bytes_host=200_000_000, bytes_disk=800_000_000, tokens=10)
    vram, copy_bw, h2d, disk = 1e9, 3e12, 50e9, 1e9
    r = bench._tier_row(st, before, vram, copy_bw, h2d, disk, tps=20.0, storage_bytes=300_000_000)
    assert r["expert_hit_vram"] == pytest.approx(0.9) and r["expert_hit_disk"] == pytest.approx(0.08)
    assert r["disk_bytes_per_token"] == pytest.approx(80e6) and r["storage_bytes_per_token"] == pytest.approx(30e6)
    t = vram / copy_bw + (20e6 + 50e6) / h2d + 30e6 / disk
    assert r["tier_bound_tok_s"] == pytest.approx(1 / t) and r["tier_pct"] == pytest.approx(100 * 20 * t)
    assert r["storage_read_GBs"] == pytest.approx(30e6 * 20 / 1e9)
    # storage unknown (no /proc/self/io): every file-tier byte is charged as a storage read
    u = bench._tier_row(st, before, vram, copy_bw, h2d, disk, tps=20.0, storage_bytes=None)
    assert u["storage_bytes_per_token"] == pytest.approx(80e6)
    assert u["tier_bound_tok_s"] == pytest.approx(1 / (vram / copy_bw + 20e6 / h2d + 80e6 / disk))
    # storage reads of other files in the window never count for more than the tier moved
    assert bench._tier_row(st, before, vram, copy_bw, h2d, disk, 20.0, int(1e12))["storage_bytes_per_token"] == pytest.approx(80e6)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="no /proc/self/io on this system")
def test_storage_read_bytes_counts_this_process():
    n = bench.storage_read_bytes()
    assert n is None or (isinstance(n, int) and n >= 0)
