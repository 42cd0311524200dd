"""The wheel ships the CUDA sources (kernels/*.cu) inside the package, so a pipx install finds them."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_kernels(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(tmp_path.glob("bw24chat-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))
    assert sources, "no kernels in the repo?"
    for s in sources:
        assert f"bw24chat/kernels/{s}" in names, f"{s} missing from the wheel"
    assert "bw24chat/kernels/common.cuh" in names
    assert "bw24chat/draft_prompts.json" in names  # train-draft's built-in prompts
    assert any(n.endswith("entry_points.txt") for n in names)
    ep = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bw24chat = bw24chat.cli:main" in zipfile.ZipFile(wheel).read(ep).decode()
