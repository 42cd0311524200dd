"""``bw24chat bench``: prefill and decode speed against the measured roofline.

Rooflines are measured in the same run: device-to-device copy bandwidth (bytes read + written
over time, 2 GiB buffers) and the fp16 tensor-core GEMM rate through cuBLAS (8192^3; Hopper's
bf16 and fp16 tensor-core rates are equal).
  decode roofline (tok/s) = copy bandwidth / bytes that must be read per token
                             (every weight matrix once + the embedding row + KV cache at that context)
  prefill roofline (tok/s) = GEMM rate / FLOPs per token (2 x matrix parameters + attention)
All timings: CUDA events after warm-up, medians of >= 5 runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from .backends.kernel_build import PDL_OFF, pdl_supported


def _events_ms(cp, fn, runs: int, warmup: int = 2, stream=None) -> list[float]:
    """CUDA-event times (ms) of fn(), recorded on the stream fn's work runs on (events on another
    stream would time nothing: the runner works on its own non-blocking stream)."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    out = []
    for _ in range(runs):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b))
    return out


def measure_copy_bandwidth(cp, nbytes: int = 2 << 30, runs: int = 10) -> float:
    src = cp.empty(nbytes // 4, cp.float32)
    src.fill(1.0)
    dst = cp.empty_like(src)
    ms = statistics.median(_events_ms(cp, lambda: dst.__setitem__(slice(None), src), runs))
    return 2 * nbytes / (ms * 1e-3)


def measure_gemm_rate(cp, n: int = 8192, runs: int = 10) -> float:
    a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    ms = statistics.median(_events_ms(cp, lambda: cp.matmul(a, b), runs))
    return 2 * n**3 / (ms * 1e-3)


def weight_bytes(runner) -> int:
    """Bytes the decode step must read: every matrix once (embedding: one row)."""
    total = 0
    for L in runner.layers:
        total += sum(L[k].nbytes for k in ("qkv", "o", "gu", "down"))
    total += runner.w_out.nbytes
    total += runner.w_embed.nbytes // runner.args.vocab_size
    return total


def kv_bytes_per_token(runner, ctx: int) -> int:
    a = runner.args
    per_elem = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0 + 4 / runner.args.head_dim, "f32": 4.0}[runner.kv_type]
    return int(2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * ctx * per_elem)


def flops_per_token(runner, ctx: int) -> float:
    a = runner.args
    D, H, K, hd, F = runner.dims
    mat = a.num_hidden_layers * (D * (H + 2 * K) * hd + H * hd * D + 3 * D * F) + D * a.vocab_size
    attn = a.num_hidden_layers * 4 * H * hd * ctx / 2  # causal: half the keys on average
    return 2 * mat + attn


def bench_runner(runner, cp, runs: int, copy_bw: float, gemm_rate: float, label: str, decode_only: bool = False,
                 prefill_only: bool = False) -> list[dict]:
    rng = np.random.default_rng(0)
    V = runner.args.vocab_size
    rows = []
    # the runner's activation contract (default float32), then pp512 / pp2048 under the other one
    # (prefill is not graph-captured, so the switch is safe here; the decode rows below run the
    # runner's own contract)
    own = runner.act_bf16
    cases = [(512, own), (2048, own), (512, not own), (2048, not own)]
    for T, xb16 in () if decode_only else cases:
        if T >= runner.n_ctx:
            continue
        runner.act_bf16 = xb16
        ids = rng.integers(0, V, T)
        ms = statistics.median(_events_ms(cp, lambda: runner.prefill(ids, 0), runs, warmup=1, stream=runner.stream))
        tps = T / (ms * 1e-3)
        roof = gemm_rate / flops_per_token(runner, T)
        rows.append(dict(model=label, test=f"pp{T}" + ("" if xb16 == own else "-bf16x" if xb16 else "-f32x"), tok_s=tps, roofline_tok_s=roof,
                         pct=100 * tps / roof, ms=ms))
    runner.act_bf16 = own
    if prefill_only:
        return rows
    from .api import SamplingParams

    greedy = SamplingParams(temperature=0)
    # greedy at both contexts; at 512 also the chat defaults (temperature 0.7) and a truncated
    # sampler (top-k 40, top-p 0.9): the device sampler's cost over a full vocabulary shows there
    cases = [(512, "", greedy), (8192, "", greedy), (512, "-t0.7", SamplingParams()),
             (512, "-k40p0.9", SamplingParams(temperature=0.7, top_k=40, top_p=0.9))]
    for ctx, tag, sp in cases:
        if ctx + 130 >= runner.n_ctx:
            continue
        ids = rng.integers(0, V, ctx)
        runner.prefill(ids, 0)
        tok = int(ids[-1])
        # warm-up (captures the graph)
        for i in range(3):
            tok = runner.sample(runner.decode(tok, ctx + i), sp, 0, ctx + i, [])
        tok = int(ids[-1])
        walls, gpu = [], []
        for r in range(runs):
            t0 = time.perf_counter()
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(runner.stream)
            for i in range(128):
                tok = runner.sample(runner.decode(tok, ctx + i), sp, 0, ctx + i, [])
            b.record(runner.stream)
            b.synchronize()
            walls.append(time.perf_counter() - t0)
            gpu.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        wall, g = statistics.median(walls), statistics.median(gpu)
        tps = 128 / wall
        nbytes = weight_bytes(runner) + kv_bytes_per_token(runner, ctx + 64)
        roof = copy_bw / nbytes
        rows.append(dict(model=label, test=f"tg128@{ctx}{tag}", tok_s=tps, roofline_tok_s=roof, pct=100 * tps / roof,
                         bytes_per_token=nbytes, host_overhead=wall / max(g, 1e-9)))
    return rows


def profile_decode(runner, cp, ctx: int, reps: int = 7, inner: int = 10) -> list[dict]:
    """Where one decode step's GPU time goes, measured inside CUDA graphs.

    One eager decode step is recorded launch by launch (kernel_build.LaunchCounter.record); the
    launches are grouped by kernel (with its compile-time defines), grid and shared memory, i.e.
    by role: qkv / o / gate-up / down matvec, rope+kv-write, attention, LM head, sampler.  Each
    group (e.g. the 36 attention launches of one step, over 36 different caches, so the L2 holds
    no more than it would in the real step) is captured as its own graph and replayed `inner`
    times between CUDA events; medians of `reps`.  The full step graph is timed the same way:
    its time minus the sum of the groups is what the joins between kernels cost (launch gaps,
    tails), since groups run their launches back to back just as the step does."""
    from .api import SamplingParams
    from .backends.kernel_build import LaunchCounter

    rng = np.random.default_rng(1)
    ids = rng.integers(0, runner.args.vocab_size, ctx)
    runner.prefill(ids, 0)
    sp = SamplingParams(temperature=0)
    tok = int(ids[-1])
    for i in range(3):  # captures the step graph
        tok = runner.sample(runner.decode(tok, ctx + i), sp, 0, ctx + i, [])
    runner._write_io(tok, ctx, sp, 0, [])
    stream = runner.stream

    def time_graph(graph) -> float:
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
        ts = []
        for _ in range(reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            for _ in range(inner):
                graph.launch(stream)
            b.record(stream)
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / inner)
        return statistics.median(ts)

    step_us = time_graph(runner.graph)
    LaunchCounter.record = []
    try:
        with stream:
            runner._step_body()
        stream.synchronize()
        launches = LaunchCounter.record
    finally:
        LaunchCounter.record = None
    groups: dict = {}
    for k, grid, block, args, kw in launches:
        groups.setdefault((id(k), grid, block, kw.get("shared_mem", 0)), []).append((k, grid, block, args, kw))
    rows = []
    for key, ls in groups.items():
        with stream:
            stream.begin_capture()
            try:
                for k, grid, block, args, kw in ls:
                    k._raw(grid, block, args, **kw)
            finally:
                g = stream.end_capture()
        us = time_graph(g)
        rows.append(dict(kernel=ls[0][0].label, grid=list(ls[0][1]), launches=len(ls), us_per_step=us,
                         us_per_launch=us / len(ls)))
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    rows.append(dict(kernel="(sum of groups)", grid=[], launches=len(launches), us_per_step=total, us_per_launch=0.0))
    rows.append(dict(kernel="(whole step graph)", grid=[], launches=len(launches), us_per_step=step_us, us_per_launch=0.0))
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bw24chat bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", help="model path (GGUF / HF dir)")
    p.add_argument("--synthetic", help="named shape with random weights: " + ", ".join(__import__("bw24chat.synthetic", fromlist=["SHAPES"]).SHAPES))
    p.add_argument("--weights", default="bf16", help="comma list for --synthetic: bf16,q8_0,q4_k,nvfp4,...")
    p.add_argument("--kv-cache", default="bf16")
    p.add_argument("--activations", choices=["f32", "bf16"], default="f32",
                   help="the matmul inputs' contract (the prefill rows are also measured under the other)")
    p.add_argument("--ctx", type=int, default=10240)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="also write the JSON here")
    p.add_argument("--decode-only", action="store_true", help="skip the prefill rows")
    p.add_argument("--prefill-only", action="store_true", help="skip the decode rows")
    p.add_argument("--profile", action="store_true",
                   help="only the per-kernel decode profile (in-graph times of each role) at context 512 and 8192")
    a = p.parse_args(argv)
    import cupy as cp

    from .backends.cuda_runner import CudaRunner

    copy_bw, gemm_rate = (0.0, 0.0) if a.profile else (measure_copy_bandwidth(cp), measure_gemm_rate(cp))
    rows = []
    if a.synthetic:
        from .synthetic import synthetic_checkpoint

        for fmt in a.weights.split(","):
            ck = synthetic_checkpoint(a.synthetic, fmt.upper())
            runner = CudaRunner(ck, a.ctx, a.kv_cache, activations=a.activations)
            if a.profile:
                _print_profile(runner, cp, f"{a.synthetic}/{fmt}", a.ctx)
            else:
                rows += bench_runner(runner, cp, a.runs, copy_bw, gemm_rate, f"{a.synthetic}/{fmt}", a.decode_only, a.prefill_only)
            del runner
            cp.get_default_memory_pool().free_all_blocks()
    else:
        from .loaders import load_checkpoint

        ck = load_checkpoint(a.model)
        runner = CudaRunner(ck, a.ctx, a.kv_cache, activations=a.activations)
        if a.profile:
            _print_profile(runner, cp, ck.name, a.ctx)
        else:
            rows += bench_runner(runner, cp, a.runs, copy_bw, gemm_rate, ck.name, a.decode_only, a.prefill_only)
    if a.profile:
        return 0
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    switches = {k: v for k, v in sorted(os.environ.items()) if k.startswith("BW24CHAT_") and k not in ("BW24CHAT_CACHE_DIR", "BW24CHAT_MODELS_DIR")}
    pdl = f"on (not {','.join(PDL_OFF)})" if pdl_supported() else "off (needs sm_90+)"
    from .backends.cuda_linear import WRA_FORMATS, gemm_impl
    from .backends.cuda_weights import FORMATS
    from .backends.kernel_refs import act_q8

    result = {"device": dev, "copy_bandwidth_GBs": copy_bw / 1e9, "gemm_TFLOPs": gemm_rate / 1e12, "kv_cache": a.kv_cache,
              "activations": a.activations,
              "pdl": pdl, "prefill_gemm": gemm_impl(), "int8_activations": [f for f in FORMATS if act_q8(f)],
              "prefill_register_a": ",".join(WRA_FORMATS) + " wide" if gemm_impl() == "wg" else "off (needs sm_90a)",
              "switches": switches, "rows": rows}
    out = json.dumps(result, indent=1)
    print(out)
    if a.json:
        open(a.json, "w").write(out)
    print(f"\n{dev}: copy {copy_bw / 1e9:.0f} GB/s, fp16 GEMM {gemm_rate / 1e12:.0f} TFLOP/s, KV cache {a.kv_cache}, "
          f"activations {a.activations}, "
          f"PDL {pdl}, prefill GEMM {result['prefill_gemm']} (register-A weights: {result['prefill_register_a']}), "
          f"int8 activations {','.join(result['int8_activations']) or 'none'}"
          + "".join(f", {k}={v}" for k, v in switches.items()))
    print(f"{'model':24} {'test':18} {'tok/s':>10} {'roofline':>10} {'%':>6}  {'bytes/tok':>12} {'wall/gpu':>8}")
    for r in rows:
        print(f"{r['model']:24} {r['test']:18} {r['tok_s']:10.1f} {r['roofline_tok_s']:10.1f} {r['pct']:6.1f}  "
              f"{r.get('bytes_per_token', ''):>12} " + (f"{r['host_overhead']:8.3f}" if "host_overhead" in r else f"{'-':>8}"))
    return 0


def _print_profile(runner, cp, label: str, max_ctx: int) -> None:
    for ctx in (512, 8192):
        if ctx + 8 >= min(runner.n_ctx, max_ctx):
            continue
        rows = profile_decode(runner, cp, ctx)
        print(json.dumps(dict(model=label, ctx=ctx, profile=rows)))
        print(f"\n{label} decode step at context {ctx}: in-graph GPU time per role")
        for r in rows:
            print(f"  {r['kernel'][:70]:70} grid {str(r['grid']):16} x{r['launches']:<4} {r['us_per_step']:9.1f} us"
                  + (f"  ({r['us_per_launch']:.2f} us each)" if r['us_per_launch'] else ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
