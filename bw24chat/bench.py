"""``bw24chat bench``: prefill and decode speed against the measured roofline.

Rooflines are measured in the same run: device-to-device copy bandwidth (bytes read + written
over time, 2 GiB buffers) and the fp16 tensor-core GEMM rate through cuBLAS (8192^3; Hopper's
bf16 and fp16 tensor-core rates are equal).
  decode roofline (tok/s) = copy bandwidth / bytes that must be read per token
                             (every weight matrix once + the embedding row + KV cache at that context;
                             hybrid models: + the recurrent state, read and written once)
  prefill roofline (tok/s) = GEMM rate / FLOPs per token (2 x matrix parameters + attention)
All timings: CUDA events after warm-up, medians of >= 5 runs.
The decode rows end with what a step of m rows costs (speculative verify) and the aggregate
speed of B = 1, 2, 8, 32 sequences decoded together by the batched step (batch{B}@512: wall time,
host included; each sequence's tokens equal its solo run's, backends/cuda_batch.py), each beside
the same steps on a non-invariant variant of the pass (batch{B}@512 gemm: every linear one prefill
GEMM over all the rows) and what the invariance costs (invariant step time / variant's - 1).
``--profile`` instead says where the time goes, per kernel role: the decode step's (each role's
launches replayed as a graph, profile_decode) and a prefill chunk's (CUDA events around every
launch of its eager walk, profile_prefill).

``--spec ngram|mtp`` instead measures speculative decoding on either backend (``--device``): an
editing workload (a paragraph of ~250 tokens, then a request to repeat it with small changes),
greedy, through the engine as a user runs it: tokens/s with and without speculation, acceptance,
tokens per verify step, the speed-up, and whether the output was token-identical.  ``mtp`` needs
a model with an MTP head; with ``--synthetic`` the random-weight shape gets a random head (and
the workload is token ids: a paragraph, then its start again), which measures what drafting
costs per K (a random head's drafts are almost never accepted).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from .backends.kernel_build import PDL_OFF, HostStep, pdl_supported


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


def measure_h2d_bandwidth(cp, nbytes: int = 1 << 30, runs: int = 10) -> float:
    """Pinned host -> device copy rate: what serves the experts spilled to host RAM."""
    host = cp.cuda.alloc_pinned_memory(nbytes)
    dst = cp.empty(nbytes, cp.uint8)
    rt = cp.cuda.runtime
    stream = cp.cuda.get_current_stream()
    ms = statistics.median(_events_ms(cp, lambda: rt.memcpyAsync(dst.data.ptr, host.ptr, nbytes, rt.memcpyHostToDevice,
                                                                 stream.ptr), runs))
    return nbytes / (ms * 1e-3)


def storage_read_bytes() -> int | None:
    """Bytes this process has made the kernel fetch from storage (/proc/self/io read_bytes: page
    cache misses, memory-mapped ones included), None where the kernel does not say."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return None


def drop_page_cache(path: str) -> None:
    """Evict a model's files from the page cache (posix_fadvise DONTNEED; a folder: each file in
    it), so the expert disk tier reads the disk, not RAM."""
    files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_gemm_rate(cp, n: int = 8192, runs: int = 10) -> float:
    a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    ms = statistics.median(_events_ms(cp, lambda: cp.matmul(a, b), runs))
    return 2 * n**3 / (ms * 1e-3)


def weight_bytes(runner) -> int:
    """Bytes the decode step must read: every matrix once (embedding: one row)."""
    return runner.decode_weight_bytes()


def kv_bytes_per_token(runner, ctx: int) -> int:
    a = runner.args
    per_elem = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0 + 4 / runner.args.head_dim, "f32": 4.0}[runner.kv_type]
    return int(2 * runner.model.n_kv_layers * a.num_key_value_heads * a.head_dim * ctx * per_elem)


def flops_per_token(runner, ctx: int) -> float:
    a = runner.args
    D, H, K, hd, F = runner.dims
    if runner.model.deltanet is not None:  # hybrid: every resident matrix once (top_k experts of MoE
        # layers), the LM head, attention over the attention layers' keys (the delta rule's ~7 flop
        # per state value and layer are 0.3 % of the Qwen3.5-9B's matrices: not counted)
        mat = sum(w.out * w.in_ for w in runner.loader.linears) + (D * a.vocab_size if runner.model.output is runner.model.tok_embd else 0)
        mat += sum(a.num_experts_per_tok * 3 * D * a.moe_intermediate_size for _ in runner.loader.experts)
        return 2 * mat + runner.model.n_kv_layers * 4 * H * hd * ctx / 2
    ffn = [3 * D * F] * a.num_hidden_layers
    if getattr(a, "num_experts", 0):  # MoE layers: top_k experts and the shared ones
        Fe = a.moe_intermediate_size
        ffn = [3 * D * Fe * (a.num_experts_per_tok + a.n_shared_experts) if a.is_moe_layer(i) else 3 * D * F
               for i in range(a.num_hidden_layers)]
    mat = a.num_hidden_layers * (D * (H + 2 * K) * hd + H * hd * D) + sum(ffn) + D * a.vocab_size
    attn = a.num_hidden_layers * 4 * H * hd * ctx / 2  # causal: half the keys on average
    return 2 * mat + attn


def _tier_row(stats, before: dict, vram_bytes: int, copy_bw: float, h2d_bw: float, disk_bw: float, tps: float,
              storage_bytes: int | None = None) -> dict:
    """A spilled-expert decode row's figures over the timed window: hits per tier, bytes moved per
    token, and the bound of reading ``vram_bytes`` in VRAM plus copying the moved bytes at the
    measured host-to-device rate.  The file tier's bytes come from the page cache or from storage:
    ``storage_bytes`` (the window's storage_read_bytes, None: unknown, all counted as storage) are
    charged at the disk's measured rate ``disk_bw`` (when given), the rest as host bytes."""
    d = {k: v - before[k] for k, v in vars(stats).items() if isinstance(v, int) and k in before}
    n = max(d["vram_hits"] + d["host_hits"] + d["disk_hits"], 1)
    tokens = max(d["tokens"], 1)
    host_b, disk_b = d["bytes_host"] / tokens, d["bytes_disk"] / tokens
    storage_b = disk_b if storage_bytes is None else min(storage_bytes / tokens, disk_b)
    cached_b = disk_b - storage_b
    t = vram_bytes / copy_bw + (host_b + cached_b) / h2d_bw + storage_b / (disk_bw or h2d_bw)
    return dict(expert_hit_vram=d["vram_hits"] / n, expert_hit_host=d["host_hits"] / n, expert_hit_disk=d["disk_hits"] / n,
                host_bytes_per_token=host_b, disk_bytes_per_token=disk_b, storage_bytes_per_token=storage_b,
                h2d_GBs=h2d_bw / 1e9, disk_GBs=disk_bw / 1e9, storage_read_GBs=storage_b * tps / 1e9,
                tier_bound_tok_s=1 / t, tier_pct=100 * tps * t)


def bench_runner(runner, cp, runs: int, copy_bw: float, gemm_rate: float, label: str, decode_only: bool = False,
                 prefill_only: bool = False, h2d_bw: float = 0.0, disk_bw: float = 0.0, cold=None,
                 verify_ctx: tuple = (512,)) -> list[dict]:
    """The prefill, decode and verify-cost rows of one runner (the verify's at each of
    ``verify_ctx`` keys).  ``cold``: called before each timed decode run (bench --drop-page-cache:
    the model's file evicted, so the file tier reads storage)."""
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
            tok = runner.step([tok], ctx + i, sp, 0, [])[0]
        tok = int(ids[-1])
        walls, gpu = [], []
        st0 = dict(vars(runner.tiers.tiers.stats)) if runner.tiers is not None else None
        storage = 0
        for r in range(runs):
            if runner.decode_state_bytes():  # each run decodes positions ctx.. again: a recurrent
                runner.prefill(ids, 0)  # state is rewound to the prompt's (untimed) first
                runner.stream.synchronize()
                tok = int(ids[-1])
            if cold is not None:
                cold()
            io0 = storage_read_bytes()
            t0 = time.perf_counter()
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(runner.stream)
            for i in range(128):
                tok = runner.step([tok], ctx + i, sp, 0, [])[0]
            b.record(runner.stream)
            b.synchronize()
            walls.append(time.perf_counter() - t0)
            gpu.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
            io1 = storage_read_bytes()
            storage = None if io0 is None or io1 is None or storage is None else storage + io1 - io0
        wall, g = statistics.median(walls), statistics.median(gpu)
        tps = 128 / wall
        nbytes = weight_bytes(runner) + kv_bytes_per_token(runner, ctx + 64) + runner.decode_state_bytes()
        roof = copy_bw / nbytes
        row = dict(model=label, test=f"tg128@{ctx}{tag}", tok_s=tps, roofline_tok_s=roof, pct=100 * tps / roof,
                   bytes_per_token=nbytes, host_overhead=wall / max(g, 1e-9))
        if st0 is not None:  # spilled experts: the bound adds the bytes the tiers moved per token
            row.update(_tier_row(runner.tiers.tiers.stats, st0, nbytes, copy_bw, h2d_bw, disk_bw, tps, storage))
        rows.append(row)
    for ctx in verify_ctx:
        rows += verify_costs(runner, runs, label, ctx)
    rows += batch_throughput(runner, runs, label)
    return rows


BATCH_SIZES = (1, 2, 8, 32)


def batch_throughput(runner, runs: int, label: str, ctx: int = 512, steps: int = 32, sizes=BATCH_SIZES) -> list[dict]:
    """Aggregate decode speed of B sequences stepped together by the batched step (backends/
    cuda_batch.py, the paged pool), each at ``ctx`` keys, greedy: B x steps tokens over the wall
    time of ``steps`` batched steps (host included, as a server runs them), against B = 1.
    Medians of runs; each run decodes positions ctx.. again.  Each B also on the non-invariant
    variant of the pass (cuda_batch.BatchStep.gemm_rows: every linear one prefill GEMM over all
    the rows, each weight read once a step, rows rounded unlike their solo runs): its row
    ``batch{B}@{ctx} gemm`` and the cost of invariance, invariant step time / variant's - 1."""
    from .api import SamplingParams
    from .backends.runner import SeqWork, max_batch

    if max_batch(runner) < max(sizes) or ctx + steps >= runner.n_ctx:
        return []
    greedy = SamplingParams(temperature=0)
    per = -(-(ctx + steps) // runner.block_size)  # blocks per sequence
    runner.init_kv_pool(max(sizes) * per)
    rng = np.random.default_rng(3)
    rows, base = [], None
    for B in sizes:
        tables = [np.arange(i * per, (i + 1) * per, dtype=np.int32) for i in range(B)]
        prompts = rng.integers(0, runner.args.vocab_size, (B, ctx))
        for i in range(B):
            runner.batch_step([SeqWork(prompts[i], 0, tables[i], True)])

        def run() -> float:
            toks = [int(p[-1]) for p in prompts]
            t0 = time.perf_counter()
            for s in range(steps):
                out = runner.batch_step([SeqWork(np.array([toks[i]]), ctx + s, tables[i], False, greedy) for i in range(B)])
                toks = [o[0] for o in out]
            return time.perf_counter() - t0

        run()  # captures the bucket's graph
        wall = statistics.median(run() for _ in range(runs))
        tps = B * steps / wall
        base = base or tps
        rows.append(dict(model=label, test=f"batch{B}@{ctx}", tok_s=tps, vs_one_seq=tps / base, ms_per_step=1e3 * wall / steps))
        runner.batch.gemm_rows = True
        try:
            run()  # captures the variant's graph
            gemm = statistics.median(run() for _ in range(runs))
        finally:
            runner.batch.gemm_rows = False
        rows.append(dict(model=label, test=f"batch{B}@{ctx} gemm", tok_s=B * steps / gemm, ms_per_step=1e3 * gemm / steps,
                         invariance_cost=wall / gemm - 1))
    runner.batch = None  # the pool's memory back
    return rows


def verify_costs(runner, runs: int, label: str, ctx: int = 512, reps: int = 32) -> list[dict]:
    """What a speculative verify of K drafts costs: one greedy step of K + 1 rows at ``ctx`` keys
    against one step of one row (the weights are read once for all rows, so the ratio should
    stay near 1 while the step is bound by weight bytes).  Wall time per step, medians of runs."""
    from .api import SamplingParams

    if ctx + 16 >= runner.n_ctx:
        return []
    greedy = SamplingParams(temperature=0)
    rows, base = [], None
    ids = np.random.default_rng(2).integers(0, runner.args.vocab_size, ctx + 16)
    runner.prefill(ids[:ctx], 0)
    for m in range(1, 10):
        toks = [int(t) for t in ids[ctx:ctx + m]]
        runner.step(toks, ctx, greedy, 0, [])  # captures this row count's graph
        walls = []
        for _ in range(runs):
            runner.stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                runner.step(toks, ctx, greedy, 0, [])
            walls.append((time.perf_counter() - t0) / reps)
        ms = 1e3 * statistics.median(walls)
        base = base or ms
        rows.append(dict(model=label, test=f"step{m}@{ctx}", ms=ms, vs_one_row=ms / base))
    return rows


def profile_role(item) -> tuple:
    """A plan item's role: a launch's key() (kernel, defines, grid, block, shared memory: what the
    plan decides of it), a host step's label (spilled experts) with the layer numbers dropped."""
    return ("host", re.sub(r"\d+", "N", item.label)) if isinstance(item, HostStep) else item.key()


def profile_groups(items) -> dict:
    """A plan's items (a runner's KernelLaunch / HostStep, or plan.Launch records) by role, in order
    of first appearance.  Every item is in exactly one group."""
    groups: dict = {}
    for item in items:
        groups.setdefault(profile_role(item), []).append(item)
    return groups


def profile_rows(groups: dict, us: dict, per: str, totals=()) -> list[dict]:
    """The profile table: one row a group of ``groups`` (``us``: its microseconds per ``per``,
    "step" or "chunk"), slowest first; then the sum of the groups and ``totals`` ((label, us):
    the whole step or chunk, timed apart)."""
    col = f"us_per_{per}"
    rows = []
    for key, items in groups.items():
        host = isinstance(items[0], HostStep)
        kernel = f"host: {key[1]}" if host else key[1] + "".join(f" {k}={v}" for k, v in key[2])
        rows.append({"kernel": kernel, "grid": [] if host else list(key[3]), "launches": len(items), col: us[key],
                     "us_per_launch": us[key] / len(items)})
    rows.sort(key=lambda r: -r[col])
    n = sum(len(items) for items in groups.values())
    for label, t in (("(sum of groups)", sum(us.values())), *totals):
        rows.append({"kernel": label, "grid": [], "launches": n, col: t, "us_per_launch": 0.0})
    return rows


def print_profile(title: str, rows: list[dict], per: str) -> None:
    print(f"\n{title}")
    for r in rows:
        print(f"  {r['kernel'][:80]:80} grid {str(r['grid']):16} x{r['launches']:<4} {r[f'us_per_{per}']:9.1f} us"
              + (f"  ({r['us_per_launch']:.2f} us each)" if r['us_per_launch'] else ""))


def profile_decode(runner, cp, ctx: int, reps: int = 7, inner: int = 10, rows: int = 1) -> list[dict]:
    """Where one decode step's GPU time goes, measured inside CUDA graphs.

    The launches of the runner's ``rows``-row plan (runner.plan: 1, a decode step; more, a verify
    of rows - 1 drafts, one pass of at most runner.max_rows) are grouped by role (profile_groups:
    qkv / o / gate-up / down matvec, rope+kv-write, attention, LM head, sampler).  Each
    group (e.g. the 36 attention launches of one step, over 36 different caches, so the L2 holds
    no more than it would in the real step) is captured as its own graph and replayed `inner`
    times between CUDA events; medians of `reps`.  The full step graph is timed the same way:
    its time minus the sum of the groups is what the joins between kernels cost (launch gaps,
    tails), since groups run their launches back to back just as the step does."""
    from .api import SamplingParams

    if not 1 <= rows <= runner.max_rows:
        raise ValueError(f"--profile-rows {rows}: one pass takes 1..{runner.max_rows} rows")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, runner.args.vocab_size, ctx)
    runner.prefill(ids, 0)
    sp = SamplingParams(temperature=0)
    toks = [int(t) for t in rng.integers(0, runner.args.vocab_size, rows)]
    for i in range(3):  # captures the step graph
        runner.step(toks, ctx + i * rows, sp, 0, [])
    runner._write_io(toks, ctx + 3 * rows, sp, 0, [])
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

    if len(runner.graphs[rows]) > 1:
        raise ValueError("--profile times the one-graph decode step (all experts resident)")
    step_us = time_graph(runner.graphs[rows][0][0])
    groups = profile_groups(runner.plan(rows))
    us = {}
    for key, ls in groups.items():
        with stream:
            stream.begin_capture()
            try:
                for L in ls:
                    L()
            finally:
                g = stream.end_capture()
        us[key] = time_graph(g)
    return profile_rows(groups, us, "step", [("(whole step graph)", step_us)])


def profile_prefill(runner, cp, runs: int = 5) -> dict:
    """Where one prefill chunk's time goes: a chunk of ``runner.prefill_chunk`` tokens at position
    0 (the pp512 row), walked eagerly over its traced plan as prefill walks it, with a CUDA event
    pair around every launch; per launch the median of ``runs`` chunks after warm-up, grouped by
    role as the decode profile is (profile_groups).  A host step (spilled experts) is timed on the
    host between stream synchronizations, so its own copies and launches count in its row.

    The events between launches perturb the chunk a little: the chunk is also timed without them
    (CUDA events around prefill, as the pp rows; that time includes tracing the plan, which the
    host does before the chunk's first launch and which is timed apart: trace_us).  Where the GPU
    waits for the host (launch-bound stretches), a launch's time includes part of that wait."""
    T = runner.prefill_chunk
    ids = np.random.default_rng(4).integers(0, runner.args.vocab_size, T)
    stream = runner.stream

    def walk() -> tuple[list, list[float], float]:
        """One instrumented chunk: its items, each one's microseconds, and the walk's."""
        items, marks, ends = [], [], (cp.cuda.Event(), cp.cuda.Event())

        def timed(item):
            if not items:
                ends[0].record(stream)
            items.append(item)
            if isinstance(item, HostStep):
                stream.synchronize()
                t0 = time.perf_counter()
                item()
                stream.synchronize()
                marks.append(1e6 * (time.perf_counter() - t0))
            else:
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                item()
                b.record(stream)
                marks.append((a, b))

        with stream:
            runner._prefill_chunk(ids, 0, False, each=timed)
            ends[1].record(stream)
        ends[1].synchronize()
        us = [m if isinstance(m, float) else 1e3 * cp.cuda.get_elapsed_time(*m) for m in marks]
        return items, us, 1e3 * cp.cuda.get_elapsed_time(*ends)

    chunk_us = 1e3 * statistics.median(_events_ms(cp, lambda: runner.prefill(ids, 0), runs, warmup=2, stream=stream))
    traces = []
    for _ in range(runs):
        t0 = time.perf_counter()
        runner.prefill_plan(T, 0)
        traces.append(1e6 * (time.perf_counter() - t0))
    walk()  # warm-up
    done = [walk() for _ in range(runs)]
    plan = done[-1][0]
    if any(list(map(profile_role, d[0])) != list(map(profile_role, plan)) for d in done):
        raise RuntimeError("the chunk's plan changed between runs")
    per_item = {id(item): statistics.median(ts) for item, ts in zip(plan, zip(*(d[1] for d in done)))}
    groups = profile_groups(plan)
    us = {key: sum(per_item[id(item)] for item in items) for key, items in groups.items()}
    walk_us, trace_us = statistics.median(d[2] for d in done), statistics.median(traces)
    rows = profile_rows(groups, us, "chunk", [("(chunk walk with the events)", walk_us),
                                             ("(chunk without events, tracing included)", chunk_us),
                                             ("(host: tracing the chunk's plan)", trace_us)])
    return dict(tokens=T, profile=rows, sum_us=sum(us.values()), walk_us=walk_us, chunk_us=chunk_us, trace_us=trace_us,
                host_steps=sum(isinstance(item, HostStep) for item in plan))


def bench_numpy(ck, threads: list[int], runs: int, prompt: int = 128, gen: int = 32) -> list[dict]:
    """The NumPy backend: prefill of ``prompt`` tokens and ``gen`` decode steps, medians of
    ``runs``, under each BLAS thread count in ``threads`` (threadpoolctl)."""
    from threadpoolctl import threadpool_limits

    from .api import SamplingParams
    from .backends.numpy_backend import NumpyRunner, numpy_runner

    model = numpy_runner(ck, prompt + gen + 8).model
    ids = np.random.default_rng(0).integers(0, model.args.vocab_size, prompt)
    greedy = SamplingParams(temperature=0)
    rows = []
    for n in threads:
        with threadpool_limits(limits=n, user_api="blas"):
            pre, dec = [], []
            for _ in range(runs):
                runner = NumpyRunner(model)
                t0 = time.perf_counter()
                tok = runner.prefill(ids, 0, greedy)
                t1 = time.perf_counter()
                for i in range(gen):
                    tok = runner.step([tok], prompt + i, greedy, 0, [])[0]
                pre.append(t1 - t0)
                dec.append(time.perf_counter() - t1)
        rows.append(dict(model=ck.name, threads=n, test=f"pp{prompt}", tok_s=prompt / statistics.median(pre)))
        rows.append(dict(model=ck.name, threads=n, test=f"tg{gen}", tok_s=gen / statistics.median(dec)))
    return rows


EDIT_PARAGRAPH = (
    "The old lighthouse at the end of the harbour was built in 1874 by a company of stonemasons from the "
    "north, who carried every block across the bay on flat-bottomed barges. For more than a century its lamp "
    "turned every night, and the keepers who lived in the cottage below kept a log of every ship that passed, "
    "every storm that broke against the rocks and every repair they made to the lens. In 1962 the light was "
    "automated and the last keeper, a quiet man named Thomas Reid, moved to the village, where he spent his "
    "mornings mending nets and his evenings telling visitors about the winter of 1947, when the sea froze "
    "along the shore and the supply boat could not reach the island for six weeks. Today the tower belongs to "
    "a small trust that opens it to visitors on summer weekends. From the gallery at the top you can see the "
    "whole coast, from the cliffs in the west to the long sandy beach in the east, and on a clear day the "
    "mountains far inland. The trust hopes to restore the keepers' cottage next year and to turn it into a "
    "museum of the harbour's history.")
EDIT_REQUEST = ("Repeat the paragraph above exactly, word for word, except: write 'lighthouse' as 'beacon', "
                "'1874' as '1875' and 'Thomas Reid' as 'Tom Reid'. Output only the paragraph.")


def edit_messages() -> list[dict]:
    """The editing request (a fresh list: a request may be amended by its consumer)."""
    return [{"role": "user", "content": EDIT_PARAGRAPH + "\n\n" + EDIT_REQUEST}]


def bench_spec(run, mode: str, ks: list[int], runs: int) -> list[dict]:
    """Plain decoding, then ``mode`` at each K (0: adaptive), greedy; each configuration once to
    warm up (CUDA graphs per row count), then the median of ``runs``.  ``run(spec, k)`` generates
    once: (decode tok/s, stats, text, tokens).  ``mean_k``: drafts per verify round (the K that
    auto chose; a fixed K's rounds carry fewer where the drafter ran short or max_tokens cut it)."""
    rows, plain = [], None
    for spec, k in [("off", 0)] + [(mode, k) for k in ks]:
        done = [run(spec, k) for _ in range(runs + 1)][1:]
        tps = statistics.median(d[0] for d in done)
        _, st, text, n = done[0]
        plain = plain or (tps, text)
        rows.append(dict(spec=spec, k="-" if spec == "off" else "auto" if k == 0 else k, tok_s=tps, speedup=tps / plain[0],
                         acceptance=st.get("spec_acceptance"), mean_len=st.get("spec_mean_len"),
                         mean_k=st["spec_drafted"] / st["spec_rounds"] if st.get("spec_rounds") else None,
                         tokens=n, identical=text == plain[1]))
    return rows


def oracle_errors(n: int, accept: float, seed: int = 0) -> set[int]:
    """The output indices where the oracle drafts a wrong token: each one independently with
    probability 1 - accept (a fixed seed: every K sees the same errors)."""
    if not 0.0 <= accept <= 1.0:
        raise ValueError(f"--accept {accept}: a probability in [0, 1]")
    return {int(i) for i in np.flatnonzero(np.random.default_rng(seed).random(n) >= accept)}


def _engine_run(engine, max_tokens: int):
    """bench_spec's ``run`` through the engine: the editing request, as a user sends it."""
    from .api import GenerationRequest, SamplingParams

    msgs = edit_messages()
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, seed=0)

    def run(spec: str, k: int):
        d = engine.submit(GenerationRequest(messages=msgs, sampling=sp, spec=spec, spec_k=k)).result()[1]
        return d.stats["decode_tps"], d.stats, d.text, d.usage.completion_tokens

    return run


def _synthetic_run(a):
    """bench_spec's ``run`` on a random-weight shape (--synthetic, the first --weights format; a
    random MTP head with --spec mtp): the gate's "edit" prompt of token ids (check.spec_cases).
    Returns (run, model name, device name)."""
    from .api import SamplingParams
    from .backends import pick_device
    from .check import spec_cases, word_tokenizer
    from .generate import Generator
    from .speculative import OracleDrafter, check_verifies, make_drafter
    from .synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint(a.synthetic, a.weights[0].upper(), mtp=a.spec == "mtp")
    n_ctx = min(a.ctx, 4096)
    if pick_device(a.device)[0] == "cuda":
        from .backends.cuda_runner import CudaRunner

        runner = CudaRunner(ck, n_ctx, a.kv_cache, activations=a.activations)
        runner.warmup()
        device = runner.cp.cuda.runtime.getDeviceProperties(runner.cp.cuda.Device().id)["name"].decode()
    else:
        from .backends.numpy_backend import numpy_runner

        runner, device = numpy_runner(ck, n_ctx), "CPU (NumPy)"
    gen = Generator(runner, word_tokenizer(runner.vocab_size))
    prompt = next(c for c in spec_cases(runner.vocab_size, n_ctx, a.max_tokens) if c.name == "edit").prompt
    sp = SamplingParams(temperature=0, max_tokens=a.max_tokens, seed=0)
    if a.spec == "oracle":  # the plain run's tokens, wrong where an independent draw fails --accept
        check_verifies(runner)
        truth = gen.generate(prompt, sp).token_ids
        errors = oracle_errors(len(truth), a.accept)
        drafter = lambda spec: None if spec == "off" else OracleDrafter(truth, errors, runner.vocab_size)  # noqa: E731
    else:
        make_drafter(a.spec, runner)  # refuses here what it cannot run
        drafter = lambda spec: make_drafter(spec, runner)  # noqa: E731

    def run(spec: str, k: int):
        r = gen.generate(prompt, sp, drafter=drafter(spec), spec_k=k)
        return r.decode_tps, r.stats, r.text, len(r.token_ids)

    return run, ck.name, device


def spec_main(a) -> int:
    from .engine import open_engine
    from .options import EngineOptions
    from .speculative import make_drafter

    ks = [0 if k == "auto" else int(k) for k in a.spec_k.split(",")]
    engine = None
    try:
        if a.synthetic:
            run, name, device = _synthetic_run(a)
        elif a.spec == "oracle":
            raise ValueError("the oracle drafts a synthetic model's plain tokens: use it with --synthetic SHAPE")
        else:
            engine = open_engine(EngineOptions(model=a.model or "default", device=a.device, n_ctx=min(a.ctx, 4096),
                                               kv_cache=a.kv_cache, max_batch=a.max_batch))
            run, name, device = _engine_run(engine, a.max_tokens), engine.info.name, engine.info.device_name
            make_drafter(a.spec, engine.runner)  # mtp on a model without a head: refused with the reason
    except ValueError as exc:
        if engine is not None:
            engine.close()
        sys.stderr.write(f"bw24chat bench --spec {a.spec}: {exc}\n")
        return 2
    try:
        rows = bench_spec(run, a.spec, ks, a.runs)
    finally:
        if engine is not None:
            engine.close()
    workload = "edit, token ids (greedy)" if a.synthetic else "edit (greedy)"
    if a.spec == "oracle":
        workload += f", oracle drafts right with probability {a.accept}"
    result = {"device": device, "model": name, "workload": workload, "rows": rows}

    def table():
        print(f"\n{result['model']} on {result['device']}: {result['workload']}, {rows[0]['tokens']} tokens")
        print(f"{'spec':6} {'K':>4} {'mean K':>6} {'tok/s':>8} {'speed-up':>8} {'accept':>7} {'tok/step':>8}  same tokens")
        for r in rows:
            acc = f"{100 * r['acceptance']:6.0f}%" if r["acceptance"] is not None else f"{'-':>7}"
            mlen = f"{r['mean_len']:8.2f}" if r["mean_len"] is not None else f"{'-':>8}"
            mk = f"{r['mean_k']:6.2f}" if r["mean_k"] is not None else f"{'-':>6}"
            print(f"{r['spec']:6} {r['k']!s:>4} {mk} {r['tok_s']:8.1f} {r['speedup']:8.2f} {acc} {mlen}  {r['identical']}")

    _emit(result, a, table)
    return 0 if all(r["identical"] for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    from .options import KV_CACHE_TYPES, MODEL_HELP, add_device_arg, add_model_arg, comma_ints, comma_list, gpu_ids, parser
    from .synthetic import FORMATS, SHAPES

    p = parser("bw24chat bench", __doc__)
    add_model_arg(p, help=MODEL_HELP + " (default: 'default' unless --synthetic)")
    add_device_arg(p, help="cuda: the GPU benchmarks against the roofline; cpu: prefill and decode of the NumPy backend "
                           "per BLAS thread count (--threads); auto: cuda where CuPy and a GPU are usable, else a "
                           "one-line notice and exit status 2")
    p.add_argument("--synthetic", choices=sorted(SHAPES), help="named shape with random weights (GPU)")
    p.add_argument("--weights", type=comma_list(FORMATS), default="bf16",
                   help="comma list of the weight formats for --synthetic: " + ", ".join(FORMATS))
    p.add_argument("--kv-cache", choices=KV_CACHE_TYPES, default="bf16", help="KV cache type on the GPU")
    p.add_argument("--activations", choices=["f32", "bf16"], default="f32",
                   help="the matmul inputs' contract (the prefill rows are also measured under the other)")
    p.add_argument("--ctx", type=int, default=10240, help="context length the GPU runner allocates")
    p.add_argument("--runs", type=int, default=5, help="timed runs per row (the median is reported)")
    p.add_argument("--threads", type=comma_ints, default="1,2",
                   help="--device cpu: comma list of BLAS thread counts to measure")
    p.add_argument("--json", action="store_true", help="print the results as JSON only (no table)")
    p.add_argument("-o", "--output", metavar="PATH", help="also write the JSON results to PATH (default: none)")
    p.add_argument("--decode-only", action="store_true", help="skip the prefill rows")
    p.add_argument("--prefill-only", action="store_true", help="skip the decode rows")
    p.add_argument("--profile", action="store_true",
                   help="only the per-kernel profiles: the decode step's (in-graph times of each role) at context 512 "
                        "and 8192, and a prefill chunk's (CUDA events around every launch); --decode-only / "
                        "--prefill-only keep one")
    p.add_argument("--verify-ctx", type=comma_ints, default="512", metavar="N,...",
                   help="keys of the verify-cost rows (a step of m = 1..9 rows; each needs --ctx above it)")
    p.add_argument("--profile-rows", type=comma_ints, default="1", metavar="M,...",
                   help="--profile: the decode steps to profile by rows (1: one token; m: a verify of m - 1 drafts)")
    p.add_argument("--vram-budget", type=float, default=0.0, metavar="GB",
                   help="MoE: VRAM the weights may take; experts beyond it are spilled (decode rows then report "
                        "hits per tier, bytes moved per token and the tier bound)")
    p.add_argument("--host-budget", type=float, default=None, metavar="GB",
                   help="MoE with --vram-budget: pinned host RAM for spilled experts (default: half the available)")
    p.add_argument("--drop-page-cache", action="store_true",
                   help="with -m MODEL: evict its files from the page cache first and before each timed decode run (the "
                        "expert file tier then reads storage; the rows report how much of it did, /proc/self/io)")
    p.add_argument("--disk-rate", type=float, default=0.0, metavar="GB/s",
                   help="the disk's sequential read rate (measured apart, e.g. dd of the model file after "
                        "--drop-page-cache), for the file tier's bound")
    p.add_argument("--gpus", type=gpu_ids, default=(), metavar="N|IDS",
                   help="split the model over N GPUs of this host (or the devices listed, 0,1): dense, hybrid and "
                        "MoE models; the decode rows' roofline is per GPU (the busiest GPU's bytes)")
    p.add_argument("--spec", choices=["ngram", "mtp", "oracle"],
                   help="speculative decoding on an editing workload instead (either backend; mtp: the model's MTP head; "
                        "oracle, with --synthetic: drafts of the plain run's tokens, each right with probability --accept)")
    p.add_argument("--accept", type=float, default=0.8, metavar="P",
                   help="--spec oracle: the probability that each draft is right, independently (the alpha of "
                        "Leviathan et al. 2023, so a round of K accepts P + ... + P^K drafts on average)")
    p.add_argument("--spec-k", default="auto,2,4,8", help="--spec: comma list of K (auto: adaptive)")
    p.add_argument("--max-tokens", type=int, default=320, help="--spec: tokens per generation")
    p.add_argument("--max-batch", type=int, default=0, metavar="N",
                   help="--spec with a model: the engine's --max-batch (default 0: the batched path; 1: the "
                        "one-sequence loop)")
    return p


def _legacy(argv: list[str]) -> list[str]:
    """``--json PATH`` (the spelling of earlier versions): ``--output PATH``."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--json" and not out[i + 1].startswith("-"):
            out[i] = "--output"
    return out


def _emit(result: dict, a, table) -> None:
    text = json.dumps(result, indent=1)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    if a.json:
        print(text)
    else:
        table()


def _bench_tiers(ck, a, cp):
    """The expert tiers at --vram-budget / --host-budget (None: dense, all resident, or no budget)."""
    if not a.vram_budget:
        return None
    from .backends.expert_tiers import ExpertTiers, layout_of, model_kv_bytes, plan_for
    from .models import get_family

    lay = layout_of(ck)
    if lay is None:
        return None
    m = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    kv = model_kv_bytes(m, a.ctx, a.kv_cache)
    plan = plan_for(lay, cp.cuda.runtime.memGetInfo()[0], a.vram_budget, a.host_budget, kv)
    return None if plan.all_resident else ExpertTiers(lay, plan)


def main(argv: list[str]) -> int:
    from .backends import cuda_status
    from .check import no_gpu

    a = build_parser().parse_args(_legacy(argv))
    if a.spec:
        return spec_main(a)
    usable, why = (False, "") if a.device == "cpu" else cuda_status()
    if a.device == "cpu":
        return _main_cpu(a)
    if not usable:
        sys.stderr.write(f"bw24chat bench: {no_gpu(why)}; the GPU benchmarks need an NVIDIA GPU with CuPy "
                         f"(pip install 'bw24chat[cuda13]' or [cuda12]); 'bw24chat bench --device cpu' measures the "
                         f"NumPy backend\n")
        return 2
    import cupy as cp

    from .backends.cuda_runner import CudaRunner

    copy_bw, gemm_rate = (0.0, 0.0) if a.profile else (measure_copy_bandwidth(cp), measure_gemm_rate(cp))
    h2d_bw = measure_h2d_bandwidth(cp) if a.vram_budget else 0.0
    rows = []

    def run(ck, label: str):
        if len(a.gpus) > 1:  # the model split over these GPUs (backends/cuda_sharded.py)
            from .backends.cuda_sharded import ShardedCudaRunner

            runner, tiers = ShardedCudaRunner(ck, a.gpus, a.ctx, a.kv_cache, activations=a.activations), None
            label += f"/{len(a.gpus)}gpus"
        else:
            tiers = _bench_tiers(ck, a, cp)
            runner = CudaRunner(ck, a.ctx, a.kv_cache, activations=a.activations, tiers=tiers)
        if tiers is not None:
            label += f"/{min(tiers.plan.vram_slots)}of{max(tiers.layout.n_experts)}vram"
        if a.profile:
            _print_profile(runner, cp, label, a.ctx, a.runs, decode=not a.prefill_only, prefill=not a.decode_only,
                           step_rows=a.profile_rows)
            return []
        cold = (lambda: drop_page_cache(str(ck.path))) if a.drop_page_cache and getattr(ck, "path", None) else None
        return bench_runner(runner, cp, a.runs, copy_bw, gemm_rate, label, a.decode_only, a.prefill_only, h2d_bw,
                            a.disk_rate * 1e9, cold, tuple(a.verify_ctx))

    if a.synthetic:
        from .synthetic import synthetic_checkpoint

        for fmt in a.weights:
            rows += run(synthetic_checkpoint(a.synthetic, fmt.upper()), f"{a.synthetic}/{fmt}")
            cp.get_default_memory_pool().free_all_blocks()
    else:
        from .console import print_downloads
        from .model_store import open_checkpoint

        ck = open_checkpoint(a.model or "default", print_downloads("bw24chat bench"))
        if a.drop_page_cache:
            drop_page_cache(str(ck.path))
        rows += run(ck, ck.name)
    if a.profile:
        return 0
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    switches = {k: v for k, v in sorted(os.environ.items()) if k.startswith("BW24CHAT_") and k not in ("BW24CHAT_CACHE_DIR", "BW24CHAT_MODELS_DIR")}
    pdl = f"on (not {','.join(PDL_OFF)})" if pdl_supported() else "off (needs sm_90+)"
    from .backends.cuda_linear import WRA_FORMATS, gemm_impl
    from .backends.cuda_weights import FORMATS
    from .backends.kernel_refs import act_q8

    result = {"device": dev, "copy_bandwidth_GBs": copy_bw / 1e9, "h2d_bandwidth_GBs": h2d_bw / 1e9, "gemm_TFLOPs": gemm_rate / 1e12, "kv_cache": a.kv_cache,
              "activations": a.activations,
              "pdl": pdl, "prefill_gemm": gemm_impl(), "int8_activations": [f for f in FORMATS if act_q8(f)],
              "prefill_register_a": ",".join(WRA_FORMATS) + " wide" if gemm_impl() == "wg" else "off (needs sm_90a)",
              "switches": switches, "rows": rows}

    def table() -> None:
        print(f"\n{dev}: copy {copy_bw / 1e9:.0f} GB/s, fp16 GEMM {gemm_rate / 1e12:.0f} TFLOP/s, KV cache {a.kv_cache}, "
              f"activations {a.activations}, "
              f"PDL {pdl}, prefill GEMM {result['prefill_gemm']} (register-A weights: {result['prefill_register_a']}), "
              f"int8 activations {','.join(result['int8_activations']) or 'none'}"
              + "".join(f", {k}={v}" for k, v in switches.items()))
        print(f"{'model':24} {'test':18} {'tok/s':>10} {'roofline':>10} {'%':>6}  {'bytes/tok':>12} {'wall/gpu':>8}")
        for r in rows:
            if "vs_one_row" in r:  # verify_costs: a step of m rows against one row
                print(f"{r['model']:24} {r['test']:18} {r['ms']:8.3f} ms  {r['vs_one_row']:5.2f} x one row")
                continue
            if "invariance_cost" in r:  # batch_throughput: the same steps on the non-invariant pass
                print(f"{r['model']:24} {r['test']:18} {r['tok_s']:10.1f} tok/s aggregate, one GEMM per linear, "
                      f"{r['ms_per_step']:.3f} ms per step; invariance costs {100 * r['invariance_cost']:+.1f} %")
                continue
            if "vs_one_seq" in r:  # batch_throughput: B sequences' aggregate against one
                print(f"{r['model']:24} {r['test']:18} {r['tok_s']:10.1f} tok/s aggregate, {r['vs_one_seq']:5.2f} x one "
                      f"sequence, {r['ms_per_step']:.3f} ms per step")
                continue
            print(f"{r['model']:24} {r['test']:18} {r['tok_s']:10.1f} {r['roofline_tok_s']:10.1f} {r['pct']:6.1f}  "
                  f"{r.get('bytes_per_token', ''):>12} " + (f"{r['host_overhead']:8.3f}" if "host_overhead" in r else f"{'-':>8}"))
            if "tier_bound_tok_s" in r:  # spilled experts: the tiers' figures and their bound
                print(f"{'':24} {'  expert tiers':18} hits vram {r['expert_hit_vram']:.1%} host {r['expert_hit_host']:.1%} "
                      f"disk {r['expert_hit_disk']:.1%}; moved per token {r['host_bytes_per_token'] / 1e6:.0f} MB from host, "
                      f"{r['disk_bytes_per_token'] / 1e6:.0f} MB from the file ({r['storage_bytes_per_token'] / 1e6:.0f} MB "
                      f"of it from storage, {r['storage_read_GBs']:.2f} GB/s); bound {r['tier_bound_tok_s']:.1f} tok/s "
                      f"at {r['h2d_GBs']:.0f} GB/s host-to-device" + (f", {r['disk_GBs']:.2f} GB/s disk" if r['disk_GBs'] else "")
                      + f": {r['tier_pct']:.0f} %")

    _emit(result, a, table)
    return 0


def _main_cpu(a) -> int:
    from threadpoolctl import threadpool_info

    from .console import print_downloads
    from .model_store import open_checkpoint

    ck = open_checkpoint(a.model or "default", print_downloads("bw24chat bench"))
    rows = bench_numpy(ck, a.threads, a.runs)
    blas = ", ".join(f"{i['internal_api']} {i.get('version')} ({i['num_threads']} threads by default)"
                     for i in threadpool_info() if i["user_api"] == "blas")
    result = {"device": "cpu", "blas": blas, "cpu_count": os.cpu_count(), "rows": rows}

    def table() -> None:
        print(f"\nNumPy backend on {os.cpu_count()} CPUs, BLAS {blas}")
        print(f"{'model':32} {'threads':>7} {'test':8} {'tok/s':>10}")
        for r in rows:
            print(f"{r['model'][:32]:32} {r['threads']:7} {r['test']:8} {r['tok_s']:10.1f}")

    _emit(result, a, table)
    return 0


def _print_profile(runner, cp, label: str, max_ctx: int, runs: int, decode: bool = True, prefill: bool = True,
                   step_rows=(1,)) -> None:
    for ctx in (512, 8192) if decode else ():
        if ctx + 8 + 4 * max(step_rows) >= min(runner.n_ctx, max_ctx):
            continue
        for m in step_rows:
            rows = profile_decode(runner, cp, ctx, rows=m)
            print(json.dumps(dict(model=label, ctx=ctx, rows=m, profile=rows)))
            what = "decode step" if m == 1 else f"{m}-row step (a verify of {m - 1} drafts)"
            print_profile(f"{label} {what} at context {ctx}: in-graph GPU time per role", rows, "step")
    if prefill and runner.prefill_chunk < runner.n_ctx:
        p = profile_prefill(runner, cp, runs)
        print(json.dumps(dict(model=label, test=f"pp{p['tokens']}", **p)))
        host = "; host steps: host time between stream synchronizations" if p["host_steps"] else ""
        print_profile(f"{label} prefill chunk of {p['tokens']} tokens at position 0: GPU time per role, CUDA events "
                      f"around every launch of the eager walk (medians of {runs} chunks; the events perturb the times "
                      f"slightly: the chunk takes {p['chunk_us'] / 1e3:.2f} ms without them, tracing its plan on the "
                      f"host {p['trace_us'] / 1e3:.2f} ms of it{host})", p["profile"], "chunk")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
