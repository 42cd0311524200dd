"""Long byte-mutation fuzzing of the model loaders (the test suite runs a bounded version).

    python tools/fuzz_models.py --minutes 20 --out fuzz.json [--real PATH/TO/model.gguf]

Targets: a tiny GGUF and a tiny safetensors folder (tests/model_factory.py; loaded, built and
run for two tokens when a mutant loads), and with --real the real GGUF (header mutations over
the whole file, loading only).  Time is split evenly; each target's counts (trials, loads,
ModelFileErrors by message class, failures: other exceptions, hangs, allocations out of
proportion) go to --out as JSON and a summary to stdout.  Exit status 1 if anything failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hostile_files import Tally, fuzz_gguf, fuzz_hf_dir  # noqa: E402
from tests.model_factory import make_gguf, make_hf_dir  # noqa: E402


def _run_for(seconds: float, step) -> Tally:
    tally, seed, end = Tally(), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        step(tally, seed)
        seed += 1
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="total running time")
    p.add_argument("--out", type=Path, default=None, help="write the counts here as JSON")
    p.add_argument("--real", type=Path, default=None, help="also fuzz this real GGUF file (header mutations)")
    a = p.parse_args(argv)
    share = a.minutes * 60 / (3 if a.real else 2)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gguf = make_gguf(work / "tiny.gguf")
        hf, _ = make_hf_dir(work / "tiny-hf", "llama", "BF16")
        results["tiny GGUF"] = _run_for(share, lambda t, s: fuzz_gguf(gguf, work, 100, s, t))
        results["tiny safetensors folder"] = _run_for(share, lambda t, s: fuzz_hf_dir(hf, work, 50, s, t))
        if a.real:
            results[a.real.name] = _run_for(share, lambda t, s: fuzz_gguf(a.real, work, 5, s, t, use_model=False, hang_s=60))
    report = {name: t.as_dict() for name, t in results.items()}
    for name, r in report.items():
        print(f"{name}: {r['trials']} trials, {r['loaded']} loaded, {r['model_file_errors']} refused with "
              f"{r['distinct_errors']} distinct messages, {len(r['failures'])} failures, slowest {r['slowest_s']} s")
        for f in r["failures"][:10]:
            print("   FAIL", f)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    return 1 if any(r["failures"] for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
