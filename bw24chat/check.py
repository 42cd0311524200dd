"""``bw24chat check``: every CUDA kernel against its NumPy reference on fresh random inputs, then
the exactness gates on a model for every weight format x KV-cache type:

  prefill-vs-decode   argmax of the tensor-core prefill logits = argmax of the decode path at
                      every position of a 512-token prompt, except near-ties (top-2 margin
                      < 1e-3, counted and reported)
  chunk-invariance    prefill logits bit-identical for chunk sizes 256 and 512
  graph-vs-eager      graph decode = eager decode, token for token (greedy, 32 tokens)
  seed                the same seed twice = the same sampled tokens
  graph-launches      no kernel launched from Python during graph decode steps

Gates run on the engine's default float32 activations; ``--activations f32,bf16`` also runs the
opt-in bf16-activation contract (every matmul input rounded to bf16 on both paths), whose
from-scratch prefill-vs-decode row shows a few argmax flips at margins of 1e-3..1e-2 on random
models (a bf16 rounding boundary crossed by the paths' ~1e-7 differences, amplified).
Prints a table; exits non-zero on any failure.  ``BW24CHAT_PORTABLE=1`` (or --portable) runs
everything on the portable kernels (mma.sync, no wgmma/TMA), as sm_120a would.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from .api import SamplingParams
from .synthetic import FORMATS

DEFAULT_FORMATS = ",".join(FORMATS)
DEFAULT_KV = "bf16,q8_0,fp8,f32"
NO_GPU_HINT = "the CUDA kernels and the GPU gates need an NVIDIA GPU with CuPy: pip install 'bw24chat[cuda13]' (or [cuda12])"


@dataclass
class Result:
    section: str
    name: str
    value: str
    limit: str
    ok: bool


def _greedy(runner, prompt, n, use_graph: bool, sp=None, seed=0):
    if hasattr(runner, "graphs"):  # CUDA: start from a fresh capture (or none)
        runner.use_graph = use_graph
        runner.graphs.clear()
    sp = sp or SamplingParams(temperature=0)
    hist = list(int(t) for t in prompt)
    tok = runner.prefill(prompt, 0, sp, seed)
    out = [tok]
    for i in range(n - 1):
        tok = runner.step([tok], len(hist), sp, seed, hist)[0]
        hist.append(out[-1])
        out.append(tok)
    return out


def model_gates(runner, label: str, n_prompt: int = 512, n_gen: int = 32) -> list[Result]:
    from .backends.kernel_build import LaunchCounter

    res = []
    rng = np.random.default_rng()
    V = runner.args.vocab_size
    prompt = rng.integers(0, V, n_prompt)
    # chunk invariance
    a = runner.prefill_logits(prompt, 0, chunk=512)
    b = runner.prefill_logits(prompt, 0, chunk=256)
    nbad = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
    res.append(Result(label, "prefill chunk 256 vs 512", f"{nbad} bits differ", "0", nbad == 0 and np.isfinite(a).all()))
    # prefill argmax vs decode argmax, position by position (decode path: matvec kernels, graph)
    runner.use_graph = True
    runner.graphs.clear()
    dec = np.empty_like(a)
    for i, t in enumerate(prompt):
        dec[i] = runner.decode_logits(int(t), i)
    top2 = np.sort(a, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    near = margin < 1e-3
    mism = (np.argmax(a, 1) != np.argmax(dec, 1)) & ~near
    rel = float(np.linalg.norm(a - dec) / np.linalg.norm(dec))
    # how close the mismatches were: the prefill's top-2 margin at each (a few)
    margins = "".join(f", margin {m:.1e} at {i}" for i, m in zip(np.flatnonzero(mism)[:3], margin[mism][:3]))
    res.append(Result(label, "prefill argmax = decode argmax",
                      f"{int(mism.sum())} mismatches, {int(near.sum())} near-ties, rel L2 {rel:.1e}{margins}",
                      "0 (ties < 1e-3 excluded)", int(mism.sum()) == 0))
    # The same comparison for ONE decode step over the prefill's own cache (32 positions): what
    # the engine does after every prompt.  With a rounding KV cache (bf16 / q8_0 / fp8) the
    # from-scratch comparison above also measures how the cache's rounding of slightly
    # different K/V values (prefill GEMM vs decode matvec, ~1e-6 apart) compounds over 512
    # positions; this one isolates the arithmetic of the two paths.
    if runner.kv_type != "f32":
        idx = np.linspace(1, len(prompt) - 1, 32).astype(int)
        step = np.empty((len(idx), a.shape[1]), np.float32)
        for j, i in enumerate(idx):
            runner.prefill(prompt[:i], 0)
            step[j] = runner.decode_logits(int(prompt[i]), int(i))
        ref = a[idx]
        near1 = near[idx]
        mism1 = (np.argmax(ref, 1) != np.argmax(step, 1)) & ~near1
        rel1 = float(np.linalg.norm(ref - step) / np.linalg.norm(step))
        res.append(Result(label, "decode step over prefill cache (32)", f"{int(mism1.sum())} mismatches, rel L2 {rel1:.1e}",
                          "0 (ties < 1e-3 excluded)", int(mism1.sum()) == 0))
    # graph vs eager
    short = prompt[:64]
    g = _greedy(runner, short, n_gen, True)
    e = _greedy(runner, short, n_gen, False)
    res.append(Result(label, "graph decode = eager decode", f"{sum(x != y for x, y in zip(g, e))} of {n_gen} differ", "0", g == e))
    # seed reproducibility
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repeat_penalty=1.1)
    s1 = _greedy(runner, short, n_gen, True, sp, seed=1234)
    s2 = _greedy(runner, short, n_gen, True, sp, seed=1234)
    s3 = _greedy(runner, short, n_gen, True, sp, seed=4321)
    res.append(Result(label, "same seed = same tokens", "equal" if s1 == s2 else "differ", "equal", s1 == s2 and s1 != s3))
    # no launches outside the graph during graph decode
    runner.use_graph = True
    _greedy(runner, short, 4, True)
    before = LaunchCounter.count
    pos = len(short) + 4
    tok = 1
    for i in range(16):
        tok = runner.step([tok], pos + i, SamplingParams(temperature=0), 0, [])[0]
    launched = LaunchCounter.count - before
    res.append(Result(label, "launches outside graph (16 steps)", str(launched), "0", launched == 0))
    return res


def kernel_checks() -> list[Result]:
    from . import kernel_checks as kc

    return [Result("kernels", name, value, limit, ok) for name, value, limit, ok in kc.run_all()]


def numpy_checks(formats: list[str], shape: str, n_prompt: int = 96, n_gen: int = 16) -> list[Result]:
    """What runs without a GPU: the NumPy dequantization of every format against gguf's own
    (bit for bit), and on a random-weight model per format the NumPy backend's prefill argmax
    against its decode argmax at every position, and seed reproducibility."""
    from gguf import quants as gq
    from gguf.constants import GGMLQuantizationType as T

    from . import quants
    from .backends.numpy_backend import numpy_runner
    from .synthetic import synthetic_checkpoint

    res = []
    rng = np.random.default_rng()
    for qtype in sorted(t for t in quants.SUPPORTED if t != T.F32):
        raw = rng.integers(0, 256, size=(7, 5 * quants.block_info(qtype)[1]), dtype=np.uint8)
        with np.errstate(all="ignore"):  # random bytes make NaN / inf scales too
            ours, theirs = quants.dequantize(raw, qtype), gq.dequantize(raw, qtype).astype(np.float32)
        bad = int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        res.append(Result("numpy", f"dequantize {T(qtype).name} = gguf.quants", f"{bad} bit mismatches", "0", bad == 0))
    for fmt in formats:
        ck = synthetic_checkpoint(shape, fmt.upper())
        runner = numpy_runner(ck, 1024)
        prompt = rng.integers(0, runner.vocab_size, n_prompt)
        a = runner.prefill_logits(prompt, 0)
        dec = np.concatenate([runner.forward([int(t)], i) for i, t in enumerate(prompt)])
        top2 = np.sort(a, axis=1)[:, -2:]
        near = top2[:, 1] - top2[:, 0] < 1e-3
        mism = int(((np.argmax(a, 1) != np.argmax(dec, 1)) & ~near).sum())
        res.append(Result(f"{shape}/{fmt}", "numpy prefill argmax = decode argmax", f"{mism} mismatches, {int(near.sum())} near-ties",
                          "0 (ties < 1e-3 excluded)", mism == 0))
        sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repeat_penalty=1.1)
        s1, s2 = (_greedy(runner, prompt[:32], n_gen, False, sp, seed=1234) for _ in range(2))
        res.append(Result(f"{shape}/{fmt}", "numpy same seed = same tokens", "equal" if s1 == s2 else "differ", "equal", s1 == s2))
    return res


def build_parser() -> argparse.ArgumentParser:
    from .options import KV_CACHE_TYPES, MODEL_HELP, add_device_arg, add_model_arg, comma_list, parser
    from .synthetic import SHAPES

    p = parser("bw24chat check", __doc__)
    add_model_arg(p, help="also gate this model on the GPU: " + MODEL_HELP + " (default: none)")
    add_device_arg(p, help="cuda: every kernel against its NumPy reference, then the gates; cpu: the NumPy-side checks "
                           "alone (dequantization against gguf, the NumPy backend's prefill vs decode and seeds); auto: "
                           "cuda where CuPy and a GPU are usable, else the NumPy-side checks and exit status 2")
    p.add_argument("--synthetic", default="tiny", choices=sorted(SHAPES), help="random-weight shape gated in every format")
    p.add_argument("--formats", type=comma_list(FORMATS), default=DEFAULT_FORMATS,
                   help="comma list of the weight formats gated: " + ", ".join(FORMATS))
    p.add_argument("--kv-cache", type=comma_list(KV_CACHE_TYPES), default=DEFAULT_KV,
                   help="comma list of the KV cache types gated: " + ", ".join(KV_CACHE_TYPES))
    p.add_argument("--kv", dest="kv_cache", type=comma_list(KV_CACHE_TYPES), help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--skip-kernels", action="store_true", help="skip the kernel-vs-reference section")
    p.add_argument("--skip-gates", action="store_true", help="skip the model gates")
    p.add_argument("--portable", action="store_true", help="force the portable (non-wgmma) kernels")
    p.add_argument("--activations", type=comma_list(("f32", "bf16")), default="f32",
                   help="comma list of the matmul-input contracts gated: f32 (the default engine), bf16 (opt-in: "
                        "its prefill-vs-decode rows are expected to show a few flips on random models)")
    return p


def no_gpu(why: str) -> str:
    """cuda_status's reason without its install advice (the caller gives its own)."""
    return "no usable CUDA GPU: " + why.split(";")[0]


def _print(results: list[Result], title: str) -> list[Result]:
    print(f"\n{title}")
    w = max(len(r.section) for r in results) if results else 10
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.section:{w}}  {r.name:36} {r.value:48} limit {r.limit}")
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)} passed, {len(bad)} failed")
    return bad


def main(argv: list[str]) -> int:
    from .backends import cuda_status

    a = build_parser().parse_args(argv)
    if a.portable:
        os.environ["BW24CHAT_PORTABLE"] = "1"
    t0 = time.time()
    usable, why = (False, "") if a.device == "cpu" else cuda_status()
    if not usable:
        if a.device == "cuda":
            sys.stderr.write(f"bw24chat check: --device cuda: {no_gpu(why)}; {NO_GPU_HINT}\n")
            return 2
        results = [] if a.skip_gates and a.skip_kernels else numpy_checks(a.formats, a.synthetic)
        bad = _print(results, f"bw24chat check on the CPU (NumPy), {time.time() - t0:.0f}s")
        if a.device == "auto":
            sys.stderr.write(f"bw24chat check: {no_gpu(why)}: ran the NumPy-side checks only (--device cpu runs "
                             f"just those); {NO_GPU_HINT}\n")
            return 2
        return 1 if bad else 0
    import cupy as cp

    from .backends import kernel_build
    from .backends.cuda_runner import CudaRunner
    from .synthetic import synthetic_checkpoint

    results: list[Result] = []
    if not a.skip_kernels:
        results += kernel_checks()
    if not a.skip_gates:
        for fmt in a.formats:
            ck = synthetic_checkpoint(a.synthetic, fmt.upper())
            for kv in a.kv_cache:
                for act in a.activations:
                    runner = CudaRunner(ck, 2048, kv, prefill_chunk=512, activations=act)
                    results += model_gates(runner, f"{a.synthetic}/{fmt}/kv={kv}" + ("" if act == "f32" else f"/x={act}"))
                    del runner
                    cp.get_default_memory_pool().free_all_blocks()
        if a.model:
            from .console import print_downloads
            from .model_store import open_checkpoint

            ck = open_checkpoint(a.model, print_downloads("bw24chat check"))
            for kv in a.kv_cache:
                for act in a.activations:
                    runner = CudaRunner(ck, 2048, kv, prefill_chunk=512, activations=act)
                    results += model_gates(runner, f"{ck.name[:20]}/kv={kv}" + ("" if act == "f32" else f"/x={act}"))
                    del runner
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    bad = _print(results, f"bw24chat check on {dev} ({kernel_build.active_arch()}), {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
