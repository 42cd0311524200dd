"""The kernel cache on disk (kernel_build.get_module / prune_kernel_cache): past its limit the
least recently used cubins go, down to 3/4 of it; CuPy's files beside ours and fresh temporary
files stay; a crashed compile's old temporary file goes."""
import hashlib
import os
import time

from bw24chat.backends import kernel_build as kb


def _file(d, name, size, age_s):
    p = d / name
    p.write_bytes(b"\0" * size)
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_prune_keeps_the_cache_under_its_limit_by_last_use(tmp_path):
    ours = [_file(tmp_path, f"matvec-sm_90a-{i:032x}.cubin", 1000, age_s=100 - i) for i in range(10)]  # ours[9] newest
    cupy_file = _file(tmp_path, "0123abcd_cupy_kernel.cubin", 5000, age_s=1000)
    old_tmp = _file(tmp_path, f"gemm_wgmma-sm_120a-{'a' * 32}.4242.tmp", 10, age_s=7200)
    new_tmp = _file(tmp_path, f"gemm_wgmma-sm_120a-{'b' * 32}.4243.tmp", 10, age_s=5)
    assert kb.prune_kernel_cache(tmp_path, limit=20_000) == 0  # under the limit: nothing but the stale tmp
    assert all(p.exists() for p in ours) and not old_tmp.exists() and new_tmp.exists()
    freed = kb.prune_kernel_cache(tmp_path, limit=8000)  # 10,000 bytes of ours: down to 6,000
    assert freed == 4000
    assert [p.exists() for p in ours] == [False] * 4 + [True] * 6  # the least recently used went first
    assert cupy_file.exists() and new_tmp.exists()


def test_a_cache_hit_marks_the_cubin_used(tmp_path, monkeypatch):
    """get_module touches the cubin it loads, so pruning keeps what runs."""
    import sys
    import types

    monkeypatch.setattr(kb, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))  # get_module's setdefault, undone after the test
    monkeypatch.setattr(kb, "_device_arch", lambda: "sm_90a")
    monkeypatch.setattr(kb, "compile_cubin", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no compile on a hit")))
    loaded = []
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawModule=lambda path: loaded.append(path) or path))
    src, opts = kb.load_source("norm"), kb._options("sm_90a", {})
    key = hashlib.sha256(repr((src, opts, kb.nvrtc_version())).encode()).hexdigest()[:32]
    cubin = _file(tmp_path, f"norm-sm_90a-{key}.cubin", 100, age_s=3600)
    kb.get_module.cache_clear()
    try:
        kb.get_module("norm", ())
    finally:
        kb.get_module.cache_clear()
    assert loaded == [str(cubin)] and time.time() - cubin.stat().st_mtime < 60
