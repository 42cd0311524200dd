"""The CUDA runner's batched step (backends/runner.py: ``batch_step``): several sequences' rows in
one step over a paged KV pool, each sequence's K/V, logits and tokens bit-identical to its solo
run on the runner's contiguous cache.

The pool is one buffer per layer for K and one for V, in the contiguous cache's layout
(kernel_refs.py) over ``(n_blocks + 1) * KV_PAGE`` rows: block b holds the positions a sequence's
table maps to rows b * KV_PAGE ..; the last block is scratch for padding rows.  Which block holds
what is the engine's (kv_pages.KVPages).  The kernels see the pool through the same contracts as
the contiguous cache: rope.cu writes K/V to given cache rows (``cache_rows``), and the attention
kernels read key tiles through block tables (attention_common.cuh KV_PAGE): the same arithmetic
in the same order, only other addresses, so a row's bits do not depend on where its keys live.

A step runs
  * each prefill item as the solo prefill does (tensor-core GEMMs, chunk-invariant rows; the
    paged prefill attention), eagerly; one that samples draws its token as ``prefill`` does;
  * every decode row of the step in passes of up to PASS_ROWS rows, each pass one CUDA graph per
    batch-size bucket (``bucket``: 1..16, then multiples of 8; padding rows write and read only
    the scratch block): the model's forward over groups of at most MAX_ROWS rows (every op of a
    layer launched once per group, ``_GroupedOps``), whose matvecs are the m-row-invariant
    kernels (each row the one-row step's arithmetic), then one sampler launch over every row,
    each with its own parameters, seed and ring.  Weights are thus read once per group of 8
    rows and step; where matvec_mma runs every linear of the model (``wide_rows``: a dense
    model's Q8_0 / NVFP4 / Q4_K weights) the linears run over spans of up to WIDE_ROWS = 16 rows
    instead (_SpanOps; the rope / K/V write and the attention still per group), reading each
    weight once per 16 rows, each row still the one-row step's arithmetic.
``bw24chat bench`` also times a non-invariant variant of the pass, what the invariance is
measured against (``gemm_rows``, _GemmRowsOps): every linear one prefill GEMM over all of the
pass's rows (each weight read once a step), the rest per group as above.  Nothing else runs it.
Hybrid models (a recurrent state per sequence) and spilled MoE experts (host steps inside the
pass) decode one sequence at a time (``max_batch`` 1).
"""
from __future__ import annotations

import numpy as np

from ..api import SamplingParams
from ..ops import Ops
from . import cuda_linear as lin
from . import cuda_ops as ops
from .cuda_linear import MMA_MAX_ROWS
from .kernel_build import eager_launches, tracing
from .kernel_refs import kv_cache_nbytes, kv_cache_shape, paged_row, paged_rows
from .cuda_opset import CudaOps, _Attention
from .cuda_runner import _HDR_OUT, _ROW_PARAMS, RING, sampler_rows, write_sampling_rows
from .runner import MAX_ROWS, SeqWork

MAX_BATCH = 64  # sequences one batch_step takes
WIDE_ROWS = MMA_MAX_ROWS  # rows per linear launch of the invariant pass where matvec_mma runs every linear (wide_rows)
PASS_ROWS = 64  # decode rows of one batched pass (more run in several passes)
_GREEDY = SamplingParams(temperature=0)  # rows that sample nothing (their token is dropped); padding rows

# The pass's step image (pinned on the host, mirrored on the device): int32 arrays of PASS_ROWS
# (tokens, positions, lengths = position + 1, sampled tokens, cache rows), then one block per row:
# its sampling params and ring (the runner's row block: cuda_runner.sampler_rows), its block
# table.  A pass of R rows copies the header and R blocks.
_TOK, _POS, _LEN, _OUT, _CROW = (i * 4 * PASS_ROWS for i in range(5))
_HDR = 5 * 4 * PASS_ROWS
_PARAMS = _ROW_PARAMS
_TABLE = _PARAMS + 4 * RING


def max_batch(runner) -> int:
    """Sequences a batched step of ``runner`` takes: MAX_BATCH, or 1 for a hybrid model or spilled
    experts (their per-sequence state and host steps stay on the one-sequence path)."""
    return 1 if runner.dn_state is not None or runner.tiers is not None else MAX_BATCH


def block_bytes(runner) -> int:
    """Bytes of one pool block over every layer, K and V."""
    a = runner.args
    return 2 * runner.model.n_kv_layers * kv_cache_nbytes(runner.kv_type, ops.KV_PAGE, a.num_key_value_heads, a.head_dim)


def step_bytes(runner, rows: int = PASS_ROWS) -> int:
    """VRAM a BatchStep of ``runner`` takes beside its pool's blocks, for steps of up to ``rows``
    decode rows: the scratch block, the pass's buffers (the one-row step's decode buffers, which
    ``runner.warmup`` allocated, and the QX buffers only m-row steps use, scaled to PASS_ROWS
    rows), logits, attention workspace and step
    image and sampler workspace, the logits copies of all but a step's last pass, and a prefill item's cache rows and
    block table (its chunks of up to prefill_chunk rows run in the runner's own prefill buffers,
    which the warm-up allocated at that size)."""
    a, V = runner.args, runner.args.vocab_size
    decode = sum(b.nbytes for (name, *_), b in runner._bufs.items() if name.startswith("d:") and not name.startswith("d:mtp."))
    decode += _qx_unallocated(runner)
    parts = _mma_part_bytes(runner)
    image = _HDR + PASS_ROWS * (_TABLE + 4 * -(-runner.n_ctx // ops.KV_PAGE) + 16)
    copies = (max(rows, 1) - 1) // PASS_ROWS * PASS_ROWS
    return (block_bytes(runner) + decode * PASS_ROWS // MAX_ROWS + (PASS_ROWS + copies) * V * 4 + image
            + ops.attn_decode_workspace_bytes(a.num_attention_heads, a.num_key_value_heads, a.head_dim, PASS_ROWS)
            + ops.sample_workspace_bytes(V, PASS_ROWS)
            + 4 * (runner.prefill_chunk + -(-runner.n_ctx // ops.KV_PAGE)) + parts)


def _qx_unallocated(runner) -> int:
    """Bytes at MAX_ROWS rows (as the decode buffers) of the QX buffers (x codes a producer hands
    its consumer: gate|up's for down, the attention's for o) that the one-row warm-up did not
    allocate and a pass may: the m-row steps' matvec_mma hands codes where the one-row SIMT
    kernel may not (cuda_linear.writes_qx / takes_qx).  Counted wherever the integer-dot contract
    could use them: a bound, not the pass's exact set."""
    from . import cuda_linear as lin
    from .kernel_refs import FLOAT_FORMATS, act_q8

    if not any(w.fmt not in FLOAT_FORMATS and act_q8(w.fmt) for w in runner.loader.linears):
        return 0
    a = runner.args
    want = {("d:qx_act", (lin.qx_row_words(w.out // 2 - w.out // 2 % 32),)) for w in runner.loader.linears
            if w.role in ("gu", "shexp_gu")}
    want.add(("d:qx_attn", (lin.qx_row_words(a.num_attention_heads * a.head_dim),)))
    have = {(name, tuple(cols)) for name, cols, *_ in runner._bufs}
    return sum(4 * MAX_ROWS * cols[0] for _, cols in want - have)


def _mma_part_bytes(runner) -> int:
    """The chain scratch of matvec_mma's K ranges (cuda_linear._mma_part: one per size on the
    pass's stream) for the matrices whose m-row launches split K, at any m up to the rows a pass's
    linear launch takes (wide_rows: MAX_ROWS, or WIDE_ROWS where its spans run the linears)."""
    sizes, shapes, rows = set(), {}, wide_rows(runner)
    for W in runner.loader.linears:
        shapes.setdefault((W.fmt, W.out, W.in_), W)
    for W in shapes.values():
        for m in range(2, rows + 1):
            if lin.matvec_impl(W, None, m) == "mma":
                plan = lin.mma_plan(W, m, "qx")
                if plan.ranges > 1:
                    sizes.add(lin.mma_part_floats(W, m, plan))
    return 4 * sum(sizes)


def bucket(rows: int) -> int:
    """The graph a pass of ``rows`` decode rows replays: exact up to 2 * MAX_ROWS (a K <= 15 verify
    of one sequence, two sequences' K <= 7 verifies), else the next multiple of MAX_ROWS: at most
    22 graphs.  A padding row costs its compute (a group's rows and a sampler row), never a value
    of the others."""
    return rows if rows <= 2 * MAX_ROWS else -(-rows // MAX_ROWS) * MAX_ROWS


def _row_runs(picks) -> list:
    """(logits array, rows) of the tokens each item sampled, items in order -> (array, rows) runs
    over one array (CudaRunner.last_logits gathers them only if asked: logprobs)."""
    runs: list = []
    for a, rows in picks:
        if runs and runs[-1][0] is a:
            runs[-1][1].extend(rows)
        else:
            runs.append((a, list(rows)))
    return runs


class _Rows:
    """A value of a grouped pass: one per group of rows (each group's CudaOps value)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list):
        self.parts = parts


def _part(v, i: int):
    return v.parts[i] if isinstance(v, _Rows) else v


class _GroupedOps(Ops):
    """The op set over a pass of more rows than one matvec launch takes: each op runs on every
    group's CudaOps in turn (groups of at most MAX_ROWS rows, or spans of WIDE_ROWS, each with its
    own row slice of the pass's buffers), so a layer's launches for all the rows follow each
    other; values are _Rows."""

    def __init__(self, groups: list):
        self.groups = groups

    def _each(self, name: str, *args, **kw):
        outs = [getattr(g, name)(*(_part(a, i) for a in args), **{k: _part(v, i) for k, v in kw.items()})
                for i, g in enumerate(self.groups)]
        if isinstance(outs[0], tuple):  # router: (ids, weights)
            return tuple(_Rows(list(o)) for o in zip(*outs))
        return _Rows(outs)

    def embed(self, table, ids):
        return self._each("embed", table, ids)

    def rmsnorm(self, x, w):
        return self._each("rmsnorm", x, w)

    def concat(self, a, b):
        return self._each("concat", a, b)

    def linear(self, x, w, residual=None):
        return self._each("linear", x, w, residual=residual)

    def swiglu(self, gu):
        return self._each("swiglu", gu)

    def rope_kv(self, qkv, spec, layer, bias=None, q_norm=None, k_norm=None):
        return self._each("rope_kv", qkv, spec, layer, bias, q_norm, k_norm)

    def attention(self, q, spec, layer):
        return self._each("attention", q, spec, layer)

    def output_gate(self, o, qkv, spec):
        return self._each("output_gate", o, qkv, spec)

    def router(self, x, gate, spec, bias=None):
        return self._each("router", x, gate, spec, bias)

    def experts(self, x, ids, weights, experts, residual, shared=None):
        return self._each("experts", x, ids, weights, experts, residual, shared)

    def lm_head(self, x, w):
        return self._each("lm_head", x, w)


class _PassOps(CudaOps):
    """Rows r0..r0+n-1 of a pass: a CudaOps (decode: matvecs; else GEMMs) bound to the image's rows
    and to those rows of the pass's buffers (every op set of a pass takes its row slices of the
    same buffers), with its LM head into those rows of the pass's logits."""

    def __init__(self, bat: "BatchStep", r0: int, n: int, decode: bool = True):
        super().__init__(bat.r, n, decode=decode)
        self.bat, self.r0 = bat, r0
        self.tokens, self.positions, self.lengths, self.kv_rows = (bat.io[k][r0:r0 + n] for k in ("tok", "pos", "len", "crow"))

    def buf(self, name, *cols, dtype="f4"):
        return self.bat.buffer(name, *cols, dtype=dtype)[self.r0:self.r0 + self.n]

    def lm_head(self, x, W):
        return self._lm_head_matvec(x, W, self.bat.logits[self.r0:self.r0 + self.n], self.n)


class _SpanOps(_PassOps):
    """Consecutive groups' rows of a pass whose linears each run once over all of them, while the
    rope / K/V write and the paged decode attention run per group of at most MAX_ROWS rows on the
    groups' own op sets (their launches exactly the invariant pass's).  Decode: up to WIDE_ROWS
    rows of the invariant pass where wide_rows says every linear runs on matvec_mma, each linear
    one m-row launch over them (each weight read once per WIDE_ROWS rows; each row the one-row
    step's arithmetic, as matvec_mma.cu's rows do not depend on m); else the gemm rows pass."""

    def __init__(self, bat: "BatchStep", groups: list, decode: bool):
        super().__init__(bat, groups[0].r0, sum(g.n for g in groups), decode)
        self.spans = [(g.r0 - self.r0, g) for g in groups]  # (first row here, group)

    def rope_kv(self, qkv, spec, layer, bias=None, q_norm=None, k_norm=None):
        qkv = self._value(qkv)  # the qkv linear over every row, then each group's rope + K/V write
        for r0, g in self.spans:
            g.rope_kv(qkv[r0:r0 + g.n], spec, layer, bias, q_norm, k_norm)
        return self.buf("q", spec.n_heads, spec.head_dim)  # (the groups wrote their rows of it)

    def _attn_decode(self, v, out, qx_out) -> None:
        for r0, g in self.spans:  # each group's attention into its rows of out (and of the QX codes)
            g._attn_decode(_Attention(v.q[r0:r0 + g.n], v.spec, v.layer), out[r0:r0 + g.n],
                           None if qx_out is None else qx_out[r0:r0 + g.n])


class _GemmRowsOps(_SpanOps):
    """The "gemm rows" pass (bench's non-invariant variant, BatchStep.gemm_rows): every linear
    (the LM head and the MoE router, shared and routed experts included) one prefill-path GEMM
    over all the pass's rows (cuda_linear.gemm: each weight read once a step, each row rounded in
    the GEMM's order, so not its solo value); the rope / K/V write and the paged decode attention
    per group as in the invariant pass, and the sampler after it as there."""

    def __init__(self, bat: "BatchStep", groups: list):
        super().__init__(bat, groups, decode=False)

    def attention(self, q, spec, layer):
        # at once, without QX codes (the o projection's GEMM takes the float outputs)
        out = self.buf("attn", spec.n_heads, spec.head_dim)
        self._attn_decode(_Attention(q, spec, layer), out, None)
        return out.reshape(self.n, -1)

    def lm_head(self, x, W):
        out = self.bat.logits[self.r0:self.r0 + self.n]
        self._linear(x, W, out)
        return out


def wide_rows(runner) -> int:
    """Rows of the invariant pass that one launch of each linear takes: WIDE_ROWS where every linear
    of the model (the LM head included) runs on matvec_mma at that many rows (Q8_0 / NVFP4 / Q4_K
    weights of a dense model: cuda_linear.matvec_impl), else MAX_ROWS (MoE experts, other formats:
    the groups' own launches)."""
    ws = [*runner.loader.linears, runner.model.output]
    if runner.loader.experts or any(lin.matvec_impl(W, None, WIDE_ROWS) != "mma" for W in ws):
        return MAX_ROWS
    return WIDE_ROWS


class BatchStep:
    """The paged pool, the pass's step image and buffers, and the batched step of a CudaRunner."""

    def __init__(self, runner, n_blocks: int, zeros=None):
        """``zeros(name, shape, dtype)``: how device arrays are made (backends/plan.py passes
        symbolic ones to trace a pass without a GPU; default: zeroed CuPy arrays)."""
        a = runner.args
        self.r, self.symbolic = runner, zeros is not None
        self._zeros = zeros or (lambda name, shape, dtype: runner.cp.zeros(shape, dtype))
        K, hd = a.num_key_value_heads, a.head_dim
        self.n_blocks, self.page = n_blocks, ops.KV_PAGE
        rows = (n_blocks + 1) * self.page  # + the scratch block of padding rows
        self.scratch_row = n_blocks * self.page
        shape, dtype = kv_cache_shape(runner.kv_type, rows, K, hd)  # the contiguous cache's layout (ops.kv_cache_alloc)
        self.pool_k = [self._zeros(f"pool_k[{i}]", shape, dtype) for i in range(runner.model.n_kv_layers)]
        self.pool_v = [self._zeros(f"pool_v[{i}]", shape, dtype) for i in range(runner.model.n_kv_layers)]
        self.max_blocks = -(-runner.n_ctx // self.page)  # a table covers one context
        self.row_bytes = -(-(_TABLE + 4 * self.max_blocks) // 16) * 16
        n = _HDR + PASS_ROWS * self.row_bytes
        self.d_img = self._zeros("bio", (n,), np.uint8)
        self.d_i32 = self.d_img.view(np.int32)
        self.io = {k: self.d_i32[o // 4:o // 4 + PASS_ROWS] for k, o in
                   (("tok", _TOK), ("pos", _POS), ("len", _LEN), ("out", _OUT), ("crow", _CROW))}
        self.logits = self._zeros("blogits", (PASS_ROWS, a.vocab_size), np.float32)
        self.attn_ws = self._zeros("battn_ws", (ops.attn_decode_workspace_bytes(a.num_attention_heads, K, hd, PASS_ROWS),),
                                   np.uint8)
        self.sample_ws = self._zeros("bsample_ws", (ops.sample_workspace_bytes(a.vocab_size, PASS_ROWS),), np.uint8)
        # a prefill item's cache rows and block table
        self.p_rows = self._zeros("bp_rows", (runner.prefill_chunk,), np.int32)
        self.p_table = self._zeros("bp_table", (self.max_blocks,), np.int32)
        # a padding row's sampler image and block table (the scratch block)
        self.pad_params, self.pad_table = ops.pack_sampling_params(_GREEDY, 0, 0), np.array([n_blocks], np.int32)
        self._pads = (0, 0)  # image rows pads[0]..pads[1]-1 hold padding rows (a pass's rows leave the others as they are)
        self._bufs: dict = {}
        self.plans: dict = {}  # (bucket, gemm_rows) -> the pass's launches
        self.graphs: dict = {}  # (bucket, gemm_rows) -> the captured pass
        # bench's non-invariant variant of the pass (_GemmRowsOps) instead of the invariant one.
        # Its graphs use the prefill GEMM's grow-only scratch (cuda_linear._scratch_u16) as traced:
        # the plan's launch arguments keep those buffers alive should a later prefill grow it
        self.gemm_rows = False
        self.h_img = bytearray(n) if self.symbolic else runner.cp.cuda.alloc_pinned_memory(n)
        self.h_i32 = np.frombuffer(self.h_img, np.int32, n // 4)
        self.h_rows = self.h_i32[_HDR // 4:].reshape(PASS_ROWS, self.row_bytes // 4)  # each row's block
        if not self.symbolic:
            runner.cp.cuda.runtime.deviceSynchronize()  # the zeroed pool and workspace before the runner's stream uses them

    def buffer(self, name: str, *cols: int, dtype: str = "f4"):
        """A pass buffer of PASS_ROWS rows at a fixed address (groups take row slices)."""
        key = (name, cols, dtype)
        b = self._bufs.get(key)
        if b is None:
            b = self._bufs[key] = self._zeros(name, (PASS_ROWS, *cols), np.dtype(dtype))
        return b

    # ------------------------------------------------------------------ the op sets
    def _pass_ops(self, r0: int, m: int, rows: int):
        """Group rows r0..r0+m-1 of a pass of ``rows`` (bucket) rows: a decode CudaOps bound to
        the image's rows, the pool, the tables, the pass's buffers and logits."""
        o = _PassOps(self, r0, m)
        o.cache_k, o.cache_v = self.pool_k, self.pool_v
        o.kv_tables = self.d_i32[(_HDR + r0 * self.row_bytes + _TABLE) // 4:]
        o.table_stride = self.row_bytes // 4
        # one workspace layout for every bucket (its arrival counters must stay where the last launch
        # zeroed them); every key a pass writes is among each row's last ``rows`` (a sequence's
        # rows in a pass are consecutive positions), the keys the attention fetches after the cache
        # write (attention_decode_tc.cu: fresh)
        o.attn_ws, o.attn_ws_rows, o.attn_rows = self.attn_ws, PASS_ROWS, rows
        return o

    def _prefill_ops(self, T: int, start: int):
        o = CudaOps(self.r, T, decode=False, start=start)
        o.cache_k, o.cache_v = self.pool_k, self.pool_v
        o.kv_rows, o.kv_tables = self.p_rows[:T], self.p_table
        return o

    # ------------------------------------------------------------------ a decode pass
    def forward(self, rows: int) -> None:
        """A pass of ``rows`` (a bucket) decode rows, as launches: the forward over groups of at most
        MAX_ROWS rows (with gemm_rows: its linears one GEMM over every row, _GemmRowsOps), then
        one sampler launch over every row."""
        r = self.r
        groups = [self._pass_ops(g0, min(MAX_ROWS, rows - g0), rows) for g0 in range(0, rows, MAX_ROWS)]
        if self.gemm_rows:
            sets = [_GemmRowsOps(self, groups)]
        else:  # the groups, or spans of wide_rows rows over them
            k = wide_rows(r) // MAX_ROWS
            sets = [gs[0] if len(gs) == 1 else _SpanOps(self, gs, decode=True)
                    for gs in (groups[i:i + k] for i in range(0, len(groups), k))]
        if len(sets) == 1:
            r.model.forward(sets[0], sets[0].tokens)
        else:
            r.model.forward(_GroupedOps(sets), _Rows([o.tokens for o in sets]))
        params, rings = sampler_rows(self.d_img[_HDR:], rows, self.row_bytes)
        ops.sample(self.logits[:rows], params, self.io["out"][:rows], rings, self.io["len"][:rows], self.sample_ws)

    def plan(self, rows: int) -> list:
        """The launches of a pass of ``rows`` decode rows, traced once (as CudaRunner.plan)."""
        key = (rows, self.gemm_rows)
        p = self.plans.get(key)
        if p is None:
            with self.r.stream, tracing() as p:
                self.forward(rows)
            self.plans[key] = p
        return p

    def _h2d(self, rows: int):
        rt = self.r.cp.cuda.runtime
        rt.memcpyAsync(self.d_img.data.ptr, self.h_img.ptr, _HDR + rows * self.row_bytes, rt.memcpyHostToDevice,
                       self.r.stream.ptr)

    def _d2h(self, rows: int):
        rt = self.r.cp.cuda.runtime
        rt.memcpyAsync(self.h_img.ptr + _OUT, self.d_img.data.ptr + _OUT, 4 * rows, rt.memcpyDeviceToHost, self.r.stream.ptr)

    def _run_pass(self, rows: int) -> None:
        """H2D image -> the pass -> D2H sampled tokens: the bucket's graph (captured at its first
        use, after one eager walk: the first launches load the kernels; the walk computes the
        same values the graph then computes again), or eagerly."""
        r = self.r
        plan = self.plan(rows)
        with r.stream:
            key = (rows, self.gemm_rows)
            graph = self.graphs.get(key) if r.use_graph else None
            if graph is None and r.use_graph:
                self._h2d(rows)
                for launch in plan:
                    launch()
                r.stream.synchronize()
                r.stream.begin_capture()
                try:
                    self._h2d(rows)
                    for launch in plan:
                        launch()
                    self._d2h(rows)
                finally:
                    graph = self.graphs[key] = r.stream.end_capture()
            if graph is not None:
                graph.launch(r.stream)
            else:
                self._h2d(rows)
                for launch in plan:
                    launch()
                self._d2h(rows)

    def _write_rows(self, i: int, ids, start: int, table, params: SamplingParams, seed: int, history) -> None:
        """Image rows i.. = decode rows ids at positions start.. of one sequence (its block table,
        its sampling): a few slice writes per sequence, not per row."""
        h, m, page = self.h_i32, len(ids), self.page
        h[_TOK // 4 + i:_TOK // 4 + i + m] = ids
        h[_POS // 4 + i:_POS // 4 + i + m] = range(start, start + m)
        h[_LEN // 4 + i:_LEN // 4 + i + m] = range(start + 1, start + m + 1)
        h[_CROW // 4 + i:_CROW // 4 + i + m] = [paged_row(table, p, page) for p in range(start, start + m)]
        rows = self.h_rows[i:i + m]
        write_sampling_rows(rows, ids, params, seed, history)
        rows[:, _TABLE // 4:_TABLE // 4 + len(table)] = table

    def _pad(self, lo: int, hi: int) -> None:
        """Image rows lo..hi-1 = padding rows (position 0 of the scratch block, greedy), written only
        if a real row was in one of them since they last were (a pass of 17 rows pads to 24)."""
        a, b = self._pads
        if lo >= hi or a <= lo and hi <= b:
            return
        h = self.h_i32
        for off in (_TOK, _POS):
            h[off // 4 + lo:off // 4 + hi] = 0
        h[_LEN // 4 + lo:_LEN // 4 + hi] = 1
        h[_CROW // 4 + lo:_CROW // 4 + hi] = self.scratch_row
        rows = self.h_rows[lo:hi]
        rows[:, :_PARAMS // 4] = self.pad_params.view(np.int32)
        rows[:, _TABLE // 4] = self.pad_table[0]
        self._pads = (min(a, lo), max(b, hi)) if a < b and lo <= b and a <= hi else (lo, hi)

    def warmup(self) -> None:
        """Compile the paged kernels and capture the one-row pass (positions 0..2 of block 0, which
        a sequence overwrites before it reads them)."""
        t = np.zeros(1, np.int32)
        self.step([SeqWork(np.array([0, 1]), 0, t, True, _GREEDY)])
        self.step([SeqWork(np.array([0]), 2, t, False, _GREEDY)])

    # ------------------------------------------------------------------ the step
    def step(self, work: list[SeqWork]) -> list[list[int]]:
        r = self.r
        if not 1 <= len(work) <= max_batch(r):
            raise ValueError(f"a batched step of {len(work)} sequences; this runner takes 1..{max_batch(r)}")
        out: list[list[int]] = [[] for _ in work]
        kept: list[list] = [[] for _ in work]  # per item, (logits array, rows) of the tokens it sampled
        passes: list[list] = []  # per pass of decode rows, its items' rows: (item, first row, rows, image row)
        tables, n_rows = {}, 0
        for j, w in enumerate(work):
            table = np.asarray(w.table, np.int32)
            if not len(w.ids):
                raise ValueError("a work item runs at least one row")
            if len(table) > self.max_blocks or (len(table) and int(table.max()) >= self.n_blocks):
                raise ValueError(f"block table {table.tolist()} outside the pool's {self.n_blocks} blocks")
            if w.prefill:
                self._prefill(j, w, [int(t) for t in w.ids], table, out, kept)
                continue
            tables[j], k, T = table, 0, len(w.ids)
            while k < T:
                i = n_rows % PASS_ROWS
                if i == 0:
                    passes.append([])
                m = min(T - k, PASS_ROWS - i)
                passes[-1].append((j, k, m, i))
                k, n_rows = k + m, n_rows + m
        for p, segs in enumerate(passes):
            n = min(n_rows - p * PASS_ROWS, PASS_ROWS)
            for j, k, m, i in segs:
                w = work[j]
                hist = w.history if k == 0 else [*w.history, *w.ids[:k]]  # (a sequence cut by a pass boundary)
                self._write_rows(i, w.ids[k:k + m], w.start + k, tables[j], w.params or _GREEDY, w.seed, hist)
            self._pads = (max(self._pads[0], n), self._pads[1])  # rows 0..n-1 are real rows now
            self._pad(n, bucket(n))
            self._run_pass(bucket(n))
            logits = self.logits
            if p + 1 < len(passes):  # the logits outlive the pass only where another pass follows
                with r.stream:
                    logits = self.logits[:n].copy()
            r.stream.synchronize()
            toks = self.h_i32[_OUT // 4:_OUT // 4 + n].tolist()
            for j, k, m, i in segs:
                w = work[j]
                if w.params is None:
                    continue
                if w.sample_all:
                    out[j] += toks[i:i + m]
                    kept[j].append((logits, range(i, i + m)))
                elif k + m == len(w.ids):
                    out[j].append(toks[i + m - 1])
                    kept[j].append((logits, (i + m - 1,)))
        r._kept = _row_runs(p for rs in kept for p in rs)
        r._rows, r._hidden = 0, []
        return out

    def _prefill(self, j: int, w: SeqWork, ids: list[int], table: np.ndarray, out: list, kept: list) -> None:
        """A prefill item: chunks of at most prefill_chunk rows through the solo prefill's launches
        on the pool; with params, the token after its last row drawn as CudaRunner.prefill draws it."""
        r, C = self.r, self.r.prefill_chunk
        with r.stream:
            self.p_table[:len(table)].set(table, stream=r.stream)
            for s in range(0, len(ids), C):
                chunk, start = ids[s:s + C], w.start + s
                T = len(chunk)
                r.p_ids[:T].set(np.asarray(chunk, np.int32), stream=r.stream)
                r.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32), stream=r.stream)
                self.p_rows[:T].set(paged_rows(table, np.arange(start, start + T), self.page).astype(np.int32),
                                    stream=r.stream)
                with eager_launches():  # launched as issued, as CudaRunner._prefill_chunk
                    r.model.forward(self._prefill_ops(T, start), r.p_ids[:T])
            if w.params is None:
                return
            end = w.start + len(ids)  # the last row's logits are in d_logits[0] (CudaOps.lm_head)
            r._write_io([ids[-1]], end - 1, w.params, w.seed, [*list(w.history)[-RING:], *ids[:-1][-RING:]])
            r._h2d_io(1)
            r._sample_rows(1)
            r._d2h_tokens(1)
            kept[j].append((r.d_logits[:1].copy(), (0,)))
        r.stream.synchronize()  # (the next item rewrites the runner's step image)
        out[j].append(int(r.h_i32[_HDR_OUT // 4]))
