"""The measurement tools the GPU runs depend on (docs/performance.md names their commands), run end
to end on this machine with small settings, so that one does not first fail on a scarce GPU call:
tools/load_latency.py on a tiny random-weight model through the NumPy engine, and
tools/serve_overhead.py (the server's host path, an instant runner) with the real model's tokenizer."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_load_latency_reports_ttft_and_the_interactive_latency(tmp_path):
    out = tmp_path / "load.json"
    r = _tool("tools/load_latency.py", "--synthetic", "tiny", "--weights", "q8_0", "--device", "cpu", "--streams", "3",
              "--prompt-tokens", "16", "--max-tokens", "4", "--rate", "100", "--ctx", "256", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["same_tokens"] is True  # the interactive reply under load = the same request alone
    for side in ("interactive_alone", "interactive_loaded"):
        assert 0 < rep[side]["itl_p50_ms"] <= rep[side]["itl_p99_ms"], side
    assert rep["itl_p99_ratio"] > 0 and 0 < rep["ttft_p50_s"] <= rep["ttft_p99_s"] <= rep["ttft_max_s"]


def test_serve_overhead_runs_every_case(smollm2_path):
    r = _tool("tools/serve_overhead.py", "-m", str(smollm2_path), "--streams", "2", "--max-tokens", "16", "--requests", "1",
              "--runs", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith(("stream", "whole"))]
    assert [(row[0], row[1]) for row in rows] == [("stream", "1"), ("stream", "2"), ("whole", "2")], r.stdout
    assert all(float(row[2]) > 0 for row in rows)
