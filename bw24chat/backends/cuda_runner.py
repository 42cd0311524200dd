"""The CUDA runner: weights resident on the GPU in their quantized form, buffers at fixed
addresses, chunked tensor-core prefill, and a decode step of m = 1..8 rows (embedding -> the
model's blocks -> LM head -> sampling) that replays as ONE CUDA graph per m; the host reads back
only the sampled token ids, through pinned memory.

The decode step is a plan (``CudaRunner.plan``): the forward pass traced once per m into its
list of launches, each a kernel bound to its grid, buffers and shared memory; a step walks it,
and the graph is the captured walk.  ``backends/plan.py`` derives the same list without a GPU.
Where the host must act inside a step (MoE experts spilled from VRAM: the router's ids decide
which experts to copy in), the plan holds a HostStep, and the step is one graph per stretch
between host steps.

The forward pass is the model file's (``models/*.py``), run on ``CudaOps``: the op set on the
CUDA kernels, deferring values so that the launches fuse, each row's arithmetic the same for
m = 1..8 (cuda_opset.py).

Prefill (chunks of ``prefill_chunk`` tokens) runs the GEMMs on tensor cores and FlashAttention
over the cache; it differs from decode by rounding only (``bw24chat check`` compares argmax and
reports near-ties).

Batched steps (backends/runner.py: batch_step; continuous batching, scheduler.py) run in
cuda_batch.py over a paged KV pool beside the sequence cache: the same op set (CudaOps bound to
the pool's cache rows and block tables), the same kernels, each sequence's bits its solo run's.

Hybrid models (gated DeltaNet layers: models/qwen3_next.py) add a recurrent state per sequence
(cuda_deltanet.py) that a pass advances and that cannot be truncated like the KV cache: a decode
step's kernels also write the state before each row into a checkpoint slot, so that rollback to
any position the latest step covers restores it exactly (speculative verify); any other rollback
recomputes it from the ids through the prefill path.

An MTP head (models/mtp.py) runs in cuda_mtp.py with its own KV cache and graphs (mtp_forward,
mtp_draft); make_cuda_runner sizes the context to the VRAM budget first (cuda_budget.py).
"""
from __future__ import annotations

import numpy as np

from ..api import SamplingParams
from ..sampling import REPEAT_WINDOW_MAX
from ..models import get_family
from . import cuda_deltanet as dn
from . import cuda_ops as ops
from .cuda_budget import RESERVE_BYTES, check_fits, fit_context, kv_token_bytes, pool_room, resident_weight_bytes
from .cuda_opset import CudaLoader, CudaOps
from .kernel_build import HostStep, eager_launches, tracing
from .runner import MAX_ROWS

RING = REPEAT_WINDOW_MAX  # recent-token ring of the repetition penalty (repeat_last_n's ceiling)

# Host <-> device step image (pinned on the host, mirrored on the device): one H2D copy at the
# start of the graph, one D2H copy of the sampled tokens at its end.  A header of per-row
# tokens, positions, lengths (= position + 1: the keys attended, and the sampled token's
# position, which keys the Philox draw) and sampled tokens; then one block per row: its
# sampling params and its ring of recent ids.  A step of m rows copies the header and m blocks.
_HDR_TOKEN, _HDR_POS, _HDR_LEN, _HDR_OUT = (i * 4 * MAX_ROWS for i in range(4))
_HDR_BYTES = 16 * MAX_ROWS
_ROW_PARAMS = 8 * ops.SAMPLE_PARAM_WORDS
_ROW_BYTES = _ROW_PARAMS + 4 * RING
_IO_BYTES = _HDR_BYTES + MAX_ROWS * _ROW_BYTES


def sampling_rows(tokens, params: SamplingParams, seed: int, history):
    """Per row of tokens[i] (positions start + i): its sampler image (ops.pack_sampling_params)
    and its ring of recent ids, oldest first: the repetition window of ``history`` (the ids
    before the rows) then tokens[:i + 1], at most repeat_last_n (capped at RING) of them."""
    n_hist = min(params.repeat_last_n, RING) if params.repeat_penalty != 1.0 else 0
    recent = list(map(int, history[-n_hist:])) if n_hist > 0 else []
    for t in tokens:
        recent.append(int(t))
        n = min(len(recent), n_hist)
        yield ops.pack_sampling_params(params, seed, n), (recent[-n:] if n else [])


def write_sampling_rows(rows: np.ndarray, tokens, params: SamplingParams, seed: int, history) -> None:
    """Write sampling_rows' images and rings into ``rows``, an int32 view (len(tokens), words) of
    the rows' blocks of a step image (params image, then ring).  Without a repetition penalty
    every row has the same image and no ring: one pack, one broadcast write (every decode step and
    speculative verify writes these)."""
    words = _ROW_PARAMS // 4
    if params.repeat_penalty == 1.0 or min(params.repeat_last_n, RING) <= 0:
        rows[:, :words] = ops.pack_sampling_params(params, seed, 0).view(np.int32)
        return
    for row, (packed, ring) in zip(rows, sampling_rows(tokens, params, seed, history)):
        row[:words] = packed.view(np.int32)
        row[words:words + len(ring)] = ring


def sampler_rows(img, m: int, row_bytes: int) -> tuple:
    """The sampler's view of m rows of a step image (``img``: uint8 device bytes from the first
    row's block on, blocks ``row_bytes`` apart, each opening with its params image and ring):
    (params (m, SAMPLE_PARAM_WORDS) uint64, rings (m, RING) int32), rows strided."""
    b = img[:m * row_bytes]
    return (b.view(np.uint64).reshape(m, row_bytes // 8)[:, :ops.SAMPLE_PARAM_WORDS],
            b.view(np.int32).reshape(m, row_bytes // 4)[:, _ROW_PARAMS // 4:_ROW_PARAMS // 4 + RING])


def sample_step_rows(r, m: int) -> None:
    """The sampler of a decode step of m rows of runner ``r`` (CudaRunner, or plan.PlanRunner):
    one launch over its step image's rows, each row's logits, params, ring and position."""
    params, rings = sampler_rows(r.d_io[_HDR_BYTES:], m, _ROW_BYTES)
    ops.sample(r.d_logits[:m], params, r.d_next[:m], rings, r.d_len[:m], r.sample_ws)


def step_passes(r, tokens: list[int], start: int, params: SamplingParams, seed: int, history, each=None):
    """A step of more rows than one pass holds (a verify of K = 8 drafts; spilled experts) as
    passes of r.max_rows rows, each row still the same arithmetic as a one-row step: r._pass per
    pass (its logits kept where another pass follows or went before), r._tokens the sampled
    ones, ``each(rows, more passes follow)`` after each.  (tokens, the kept logits.)"""
    out, kept, hist, P = [], [], list(history[-RING:]), r.max_rows
    for s in range(0, len(tokens), P):
        rows = tokens[s:s + P]
        if kept or s + P < len(tokens):
            kept.append(r._pass(rows, start + s, params, seed, hist, keep=True))
        else:
            r._pass(rows, start + s, params, seed, hist)
        out += r._tokens(len(rows))
        hist += rows
        if each is not None:
            each(len(rows), s + P < len(tokens))
    return out, kept


class CudaRunner:
    """The runner interface (backends/runner.py) on one GPU."""

    state_checkpoints = True  # speculative.make_drafter: a verify's rollback restores a recurrent state exactly

    def __init__(self, checkpoint, n_ctx: int = 0, kv_type: str = "bf16", prefill_chunk: int = 512,
                 use_graph: bool = True, progress=None, activations: str = "f32", tiers=None, shard=None):
        import cupy as cp

        self.cp = cp
        self.device = cp.cuda.Device()  # the GPU it was built on (current then)
        fam = get_family(checkpoint.arch)
        # ``shard``: this runner is one GPU of a model split over several (cuda_sharded.Shard: its
        # share of the weights and heads, the ops that exchange partial results)
        self.shard = shard
        a = self.args = shard.args if shard is not None else fam.ModelArgs.from_dict(checkpoint.config)
        self.n_ctx = min(n_ctx or a.max_position_embeddings, a.max_position_embeddings)
        self.vocab_size = a.vocab_size
        self.kv_type = kv_type
        self.prefill_chunk = prefill_chunk
        if hasattr(a, "deltanet_spec") and prefill_chunk % dn.GDN_CHUNK:
            # passes start at the delta rule's chunk boundaries (cuda_deltanet.prefill): a call's
            # results then do not depend on its passes
            raise ValueError(f"prefill_chunk {prefill_chunk}: a multiple of {dn.GDN_CHUNK} for a hybrid model")
        self.use_graph = use_graph
        # the matmul inputs' contract, one for prefill and decode (the decode graphs are captured
        # with it): "f32" keeps them exact (prefill and decode logits ~1e-5 apart); "bf16" rounds
        # every product's input to bf16 first (common.cuh bf16_round), as bf16 engines do: one
        # bf16 plane in the prefill GEMMs (pp512 +30-45 %), at the price of prefill and decode
        # logits ~3e-3 apart (docs/performance.md)
        if activations not in ("bf16", "f32"):
            raise ValueError(f"activations: bf16 or f32, got {activations!r}")
        self.activations = activations
        self.act_bf16 = activations == "bf16"
        # MoE experts spilled from VRAM (expert_tiers.ExpertTiers): a pass holds at most slots // top_k
        # rows, so that its experts fit the slots together (rows are row-invariant: the same bits)
        self.max_rows = MAX_ROWS
        cuda_tiers = None
        if tiers is not None:
            from .cuda_tiers import CudaTiers

            self.max_rows = max(1, min(MAX_ROWS, min(tiers.plan.vram_slots) // a.num_experts_per_tok))
            cuda_tiers = CudaTiers(tiers, a.num_experts_per_tok, MAX_ROWS)
        self.tiers = cuda_tiers
        if shard is not None:
            from .cuda_sharded import ShardLoader, ShardOps

            self.loader, self.Ops = ShardLoader(shard), ShardOps
        else:
            self.loader, self.Ops = CudaLoader(cuda_tiers), CudaOps
        report = progress or (lambda f: None)
        self.model = fam.Model(a, self.loader, shard.tensors if shard is not None else checkpoint.tensors, self.n_ctx,
                               report)
        D, H, K, hd = a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.dims = (D, H, K, hd, a.intermediate_size)
        self._rope: dict = {}
        # the decode attention writes the o projection's QX codes (attention.cu ATTN_QX); tests
        # turn it off to compare bits
        self.attn_qx = True

        # ---------------------------------------------------------------- KV cache
        n_kv = self.model.n_kv_layers  # a hybrid model caches its attention layers only
        self.cache_k = [ops.kv_cache_alloc(kv_type, self.n_ctx, K, hd) for _ in range(n_kv)]
        self.cache_v = [ops.kv_cache_alloc(kv_type, self.n_ctx, K, hd) for _ in range(n_kv)]
        # ---------------------------------------------------------------- recurrent state (hybrid models)
        # cuda_deltanet's buffers; the positions the state has consumed; the positions whose
        # checkpoint slots the latest step wrote [lo, hi); the ids at positions 0.. (recompute)
        spec = self.model.deltanet
        self.dn_state = None if spec is None else \
            {k: cp.zeros(s, cp.float32) for k, s in dn.state_shapes(spec, self.model.n_state_layers).items()}
        self.state_pos, self._slot_range, self._ids = 0, (0, 0), []

        # ---------------------------------------------------------------- buffers (fixed addresses)
        self._bufs: dict = {}
        self.d_logits = cp.zeros((MAX_ROWS, a.vocab_size), cp.float32)
        self.attn_ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd, MAX_ROWS), cp.uint8)
        self.sample_ws = cp.zeros(ops.sample_workspace_bytes(a.vocab_size, MAX_ROWS), cp.uint8)
        self.p_ids, self.p_pos = cp.zeros(prefill_chunk, cp.int32), cp.zeros(prefill_chunk, cp.int32)
        self.h_io = cp.cuda.alloc_pinned_memory(_IO_BYTES)
        self.h_i32 = np.frombuffer(self.h_io, np.int32, _IO_BYTES // 4)
        self.d_io = cp.zeros(_IO_BYTES, cp.uint8)
        i32 = lambda off: self.d_io[off:off + 4 * MAX_ROWS].view(cp.int32)  # noqa: E731
        self.d_tokens, self.d_pos, self.d_len, self.d_next = (i32(o) for o in (_HDR_TOKEN, _HDR_POS, _HDR_LEN, _HDR_OUT))
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.plans: dict = {}  # rows -> the decode step's launches (kernel_build.KernelLaunch / HostStep)
        self.graphs: dict = {}  # rows -> the captured decode step: [(graph, the HostStep after it or None)]
        self._rows = 1  # rows of the last pass (last_logits)
        # the logits of each pass of a step over more than MAX_ROWS rows; a batched step's are
        # (logits array, rows) pairs, gathered only if asked (cuda_batch.BatchStep.step)
        self._kept: list = []
        self._hidden: list = []  # the trunk's last-layer rows of the last prefill / step, per pass (last_hidden)
        self.batch = None  # init_kv_pool: the paged pool and the batched step (cuda_batch.py)
        self.pool_budget: int | None = None  # kv_pool_room's cap: what the fit left of a VRAM budget
        # the MTP head (cuda_mtp.py: its own KV cache, step image and graphs) and the model's head
        # it runs (the runner interface's ``mtp``), or None
        from .cuda_mtp import load_head

        self.cuda_mtp = load_head(self, checkpoint) if shard is None else None
        self.mtp = self.cuda_mtp.head if self.cuda_mtp is not None else None
        # Everything above was allocated, zeroed and uploaded on the legacy default stream, which
        # the runner's non-blocking stream does not wait for: finish it before the first step
        # reads the caches, the norm weights or the attention workspace's zeroed counters (on a
        # busy GPU the runner's first kernels otherwise overtake them).
        cp.cuda.runtime.deviceSynchronize()

    # ==================================================================== buffers
    def buffer(self, name: str, rows: int, *cols: int, dtype: str = "f4"):
        """A persistent buffer (name -> fixed address, sized for the most rows a pass of its
        kind runs), its first ``rows`` rows.  Allocated on first use: eagerly, before any graph
        is captured (_capture runs the step once eagerly first)."""
        key = (name, cols, dtype)  # one name may serve two widths (a dense layer's act, a shared expert's)
        b = self._bufs.get(key)
        if b is None:
            cap = MAX_ROWS if name.startswith("d:") else self.prefill_chunk
            b = self._bufs[key] = self.cp.zeros((cap, *cols), np.dtype(dtype))
        return b[:rows]

    def rope_tables(self, table):
        key = id(table)
        if key not in self._rope:
            self._rope[key] = (table, self.cp.asarray(table.cos), self.cp.asarray(table.sin))
        return self._rope[key][1:]

    # ==================================================================== prefill
    def prefill_plan(self, T: int, start: int, all_logits: bool = False) -> tuple[list, object]:
        """The launches (and host steps) of a prefill chunk of T tokens at ``start``, traced as the
        decode step's plan is (kernel_build.tracing); and the logits buffer it fills.  A chunk's
        plan depends on T and start (the GEMMs' token counts, the attention's keys), so it is
        traced per chunk rather than kept."""
        with self.stream, tracing() as plan:
            out = self.model.forward(self.Ops(self, T, decode=False, start=start, all_logits=all_logits), self.p_ids[:T])
        return plan, out

    def _prefill_chunk(self, ids: np.ndarray, start: int, all_logits: bool, each=None):
        """One prefill chunk: its ids and positions to the device, then its launches (and host
        steps) made as the forward pass issues them, so the GPU works through the chunk while
        Python issues the rest (tracing the whole plan first left the GPU idle for the trace).
        The launches are those of prefill_plan.  ``each(item)``: trace the plan, then run each
        item through ``each`` (bench --profile times every launch)."""
        T = len(ids)
        self._advance(ids, start)
        self.p_ids[:T].set(np.asarray(ids, np.int32), stream=self.stream)
        self.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32), stream=self.stream)
        if each is None:
            with self.stream, eager_launches():  # host-launched: CuPy's cheaper launch path (kernel_build)
                return self.model.forward(self.Ops(self, T, decode=False, start=start, all_logits=all_logits), self.p_ids[:T])
        plan, out = self.prefill_plan(T, start, all_logits)
        with eager_launches():
            for item in plan:
                each(item)
        return out

    def prefill(self, ids, start: int, params: SamplingParams | None = None, seed: int = 0,
                history: list[int] = ()) -> int | None:
        ids = np.asarray(ids)
        hidden = []
        with self.stream:
            for s in range(0, len(ids), self.prefill_chunk):
                self._prefill_chunk(ids[s: s + self.prefill_chunk], start + s, False)
                hidden.append(self._hidden_rows("p", len(ids[s: s + self.prefill_chunk]), s + self.prefill_chunk < len(ids)))
        self._rows, self._kept, self._hidden = 1, [], hidden
        if params is None:
            return None
        # the first token after the prompt: its logits are already in d_logits[0]
        end = start + len(ids)
        self._write_io([int(ids[-1])], end - 1, params, seed, [*history[-RING:], *map(int, ids[:-1][-RING:])])
        with self.stream:
            self._h2d_io(1)
            self._sample_rows(1)
            self._d2h_tokens(1)
        self.stream.synchronize()
        return int(self.h_i32[_HDR_OUT // 4])

    def prefill_logits(self, ids, start: int, chunk: int | None = None) -> np.ndarray:
        """Logits at every position (T, V), host (checks: chunk invariance, argmax)."""
        chunk = chunk or self.prefill_chunk
        if chunk > self.prefill_chunk:
            raise ValueError(f"chunk {chunk} > the buffers' {self.prefill_chunk}")
        if self.dn_state is not None and chunk % dn.GDN_CHUNK:
            raise ValueError(f"chunk {chunk}: a multiple of {dn.GDN_CHUNK} for a hybrid model (cuda_deltanet.prefill)")
        ids = np.asarray(ids)
        with self.stream:
            outs = [self._prefill_chunk(ids[s: s + chunk], start + s, True) for s in range(0, len(ids), chunk)]
            out = self.cp.concatenate(outs)
        # the runner works on its own non-blocking stream: read back after its kernels finish
        self.stream.synchronize()
        return self.cp.asnumpy(out)

    # ==================================================================== decode step
    def _h2d_io(self, m: int):
        rt = self.cp.cuda.runtime
        # a raw runtime copy: CuPy refuses H2D copies while capturing; CUDA allows them from pinned memory
        rt.memcpyAsync(self.d_io.data.ptr, self.h_io.ptr, _HDR_BYTES + m * _ROW_BYTES, rt.memcpyHostToDevice,
                       self.stream.ptr)

    def _d2h_tokens(self, m: int):
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(self.h_io.ptr + _HDR_OUT, self.d_io.data.ptr + _HDR_OUT, 4 * m, rt.memcpyDeviceToHost,
                       self.stream.ptr)

    def _sample_rows(self, m: int):
        sample_step_rows(self, m)

    def plan(self, m: int = 1) -> list:
        """The launches of a decode step of m rows, in order: the model's forward on CudaOps and
        the sampler, traced once (kernel_build.tracing: kernels bound to the runner's buffers,
        nothing launched) and walked by every step; ``backends/plan.py`` derives the same list
        from the dims and GPU properties alone."""
        p = self.plans.get(m)
        if p is None:
            with self.stream, tracing() as p:
                self.model.forward(self.Ops(self, m, decode=True), self.d_tokens[:m])
                self._sample_rows(m)
            self.plans[m] = p
        return p

    def _step_body(self, m: int = 1):
        """One decode step of m rows, eagerly: H2D step image -> walk the plan -> D2H sampled tokens."""
        self._h2d_io(m)
        for launch in self.plan(m):
            launch()
        self._d2h_tokens(m)

    def _capture(self, m: int):
        """The step as graphs: one for the whole plan, or one per stretch between host steps."""
        plan, segments, cur = self.plan(m), [], []
        for item in plan:
            if isinstance(item, HostStep):
                segments.append((cur, item))
                cur = []
            else:
                cur.append(item)
        segments.append((cur, None))
        graphs = []
        with self.stream:
            for i, (launches, host) in enumerate(segments):
                self.stream.begin_capture()
                try:
                    if i == 0:
                        self._h2d_io(m)
                    for launch in launches:
                        launch()
                    if host is None:
                        self._d2h_tokens(m)
                finally:
                    graphs.append((self.stream.end_capture(), host))
        self.graphs[m] = graphs

    def _write_io(self, tokens, start: int, params: SamplingParams, seed: int, history):
        """Rows tokens[i] at positions start + i; each row's params and ring (its history:
        ``history`` then tokens[:i+1])."""
        h, m = self.h_i32, len(tokens)
        h[_HDR_TOKEN // 4:_HDR_TOKEN // 4 + m] = tokens
        h[_HDR_POS // 4:_HDR_POS // 4 + m] = range(start, start + m)
        h[_HDR_LEN // 4:_HDR_LEN // 4 + m] = range(start + 1, start + m + 1)
        rows = h[_HDR_BYTES // 4:(_HDR_BYTES + m * _ROW_BYTES) // 4].reshape(m, _ROW_BYTES // 4)
        write_sampling_rows(rows, tokens, params, seed, history)

    def step(self, tokens, start: int, params: SamplingParams, seed: int, history) -> list[int]:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("a step runs at least one row")
        self._advance(tokens, start, step=True)
        hidden = []
        out, self._kept = step_passes(self, tokens, start, params, seed, history,
                                      lambda n, more: hidden.append(self._hidden_rows("d", n, more)))
        self._hidden = hidden
        return out

    def _tokens(self, n: int) -> list[int]:
        """The tokens the last pass sampled for its n rows."""
        return self.h_i32[_HDR_OUT // 4:_HDR_OUT // 4 + n].tolist()

    def _pass(self, rows: list[int], start: int, params: SamplingParams, seed: int, history, keep: bool = False):
        m = len(rows)
        self._write_io(rows, start, params, seed, history)
        if self.use_graph:
            if m not in self.graphs:
                self._capture(m)
            with self.stream:
                for graph, host in self.graphs[m]:
                    graph.launch(self.stream)
                    if host is not None:
                        host()
        else:
            with self.stream:
                self._step_body(m)
        self._rows, kept = m, None
        if keep:
            with self.stream:  # the copy follows the step on the runner's stream
                kept = self.d_logits[:m].copy()
        self.stream.synchronize()
        return kept

    def last_logits(self) -> np.ndarray:
        self.stream.synchronize()
        if self._kept:
            return np.concatenate([self.cp.asnumpy(k[0][k[1]] if isinstance(k, tuple) else k) for k in self._kept])
        return self.cp.asnumpy(self.d_logits[:self._rows])

    def rollback(self, n: int) -> None:
        """Positions >= n are stale; the position-indexed cache overwrites them before any read
        (the MTP head's cache likewise: its next catch-up rewrites its positions from the first
        stale one, speculative.MTPDrafter).  A hybrid model's recurrent state is rewound to
        position n: from its checkpoint slot where the latest step covers n (bit for bit: the
        speculative verify's case), to zeros at n = 0, else recomputed from the ids at positions
        0..n-1 through the prefill path (what a fresh prompt of those ids gives; the last step's
        logits are kept, a prefill's hidden rows are not)."""
        if self.dn_state is None or n >= self.state_pos:
            return
        st, rt = self.dn_state, self.cp.cuda.runtime
        lo, hi = self._slot_range
        if lo <= n < hi:
            for name in ("conv", "ssm"):
                src = st[name + "_ckpt"][n % dn.STATE_SLOTS]
                rt.memcpyAsync(st[name].data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice, self.stream.ptr)
            self.state_pos, self._slot_range = n, (lo, n)
            return
        if self.shard is not None:  # one GPU of a split model recomputes only in lockstep with the others
            raise RuntimeError("a split model's recurrent state is recomputed by ShardedCudaRunner.rollback")
        with self.stream:
            kept = self._kept or [self.d_logits[:self._rows].copy()]
        for name in ("conv", "ssm"):
            rt.memsetAsync(st[name].data.ptr, 0, st[name].nbytes, self.stream.ptr)
        self.state_pos, self._slot_range = 0, (0, 0)
        ids = np.asarray(self._ids[:n], np.int64)
        with self.stream:
            for s in range(0, n, self.prefill_chunk):
                self._prefill_chunk(ids[s:s + self.prefill_chunk], s, False)
        self._kept = kept

    def _advance(self, ids, start: int, step: bool = False) -> None:
        """Before a pass (prefill chunk) or a step over ``ids`` at positions start..: a hybrid
        model's state must hold exactly the positions before start (rewound if it holds more);
        the ids are recorded, and a step's rows are the checkpoint slots' (the last STATE_SLOTS
        of them)."""
        if self.dn_state is None:
            return
        if start > self.state_pos:
            raise ValueError(f"a pass at position {start}, but the recurrent state holds {self.state_pos} positions")
        self.rollback(start)
        end = start + len(ids)
        self._ids[start:] = [int(t) for t in ids]
        self.state_pos, self._slot_range = end, ((max(start, end - dn.STATE_SLOTS), end) if step else (0, 0))

    # ==================================================================== batched steps (runner.py)
    block_size = ops.KV_PAGE  # positions per block of the paged pool (the attention kernels' KV_PAGE)

    @property
    def max_batch(self) -> int:
        from . import cuda_batch

        return cuda_batch.max_batch(self)

    def kv_block_bytes(self) -> int:
        from . import cuda_batch

        return cuda_batch.block_bytes(self)

    def kv_pool_room(self, step_rows: int) -> tuple[int, str]:
        """Bytes of VRAM the pool's blocks may take now, before the pool exists (runner.py), and
        where that figure comes from (pool_room): what is free after the weights, the cache and
        the warm-up, capped by what the fit before loading left of the budget (``pool_budget``,
        make_cuda_runner), less the batched step's own buffers (cuda_batch.step_bytes)."""
        from . import cuda_batch

        free = self.cp.cuda.runtime.memGetInfo()[0] + self.cp.get_default_memory_pool().free_bytes()
        return pool_room(free, self.pool_budget, cuda_batch.step_bytes(self, step_rows), self.n_ctx)

    def init_kv_pool(self, n_blocks: int) -> None:
        """The paged pool of batched steps (cuda_batch.BatchStep), beside the sequence cache."""
        from . import cuda_batch

        self.batch = None  # the old pool's memory first
        batch = cuda_batch.BatchStep(self, n_blocks)
        batch.warmup()
        self.batch = batch  # (only a pool that warmed up: one that ran out of memory is let go)

    def batch_step(self, work) -> list[list[int]]:
        """One batched step over the pool (runner.py: batch_step; cuda_batch.BatchStep.step)."""
        if self.batch is None:
            raise RuntimeError("batch_step before init_kv_pool")
        return self.batch.step(work)

    def decode_logits(self, token: int, pos: int) -> np.ndarray:
        """One greedy decode step (graph or eager, as configured); host copy of its logits."""
        self.step([token], pos, SamplingParams(temperature=0), 0, [])
        return self.last_logits()[0]

    def warmup(self) -> None:
        """Compile every kernel the runner uses (NVRTC, cached on disk after the first start) and
        capture the one-row decode graph (and the MTP head's first graphs), so the first request
        pays neither.  Positions 0..3 of the caches are overwritten later like any other."""
        greedy = SamplingParams(temperature=0)
        self.prefill(np.array([0, 1], np.int64), 0, greedy)
        self.step([0], 2, greedy, 0, [])
        if self.mtp is not None:  # the head's kernels, its one-row pass and a chain of one
            self.mtp_draft([0], self.last_hidden(), 2, 2, greedy, 0, [])

    def decode_weight_bytes(self) -> int:
        """Bytes one decode step must read of the weights: every matrix once, top_k experts of each
        MoE layer, one embedding row (the whole table where it is also the LM head), the conv taps."""
        total = sum(w.nbytes for w in self.loader.linears) + sum(w.nbytes for w in self.loader.convs)
        # MoE: top_k experts of each layer (gate|up and down); a GPU of a split model holds count of
        # the E (ex.nbytes is theirs): its expected share, top_k x count / E, with routing spread evenly
        total += sum(self.args.num_experts_per_tok * ex.nbytes // ex.n_experts for ex in self.loader.experts)
        emb = self.model.tok_embd
        return total + (emb.nbytes if self.model.output is emb else emb.nbytes // self.vocab_size)

    def decode_state_bytes(self) -> int:
        """Bytes of recurrent state one decode step reads and writes (hybrid models; 0 otherwise):
        the conv and delta-rule states, read once and written once (the checkpoint copies the
        step also writes are not counted: a roofline's bytes are what the step must move)."""
        if self.dn_state is None:
            return 0
        return 2 * dn.state_bytes(self.model.deltanet, self.model.n_state_layers, checkpoints=False)

    def expert_stats(self) -> dict:
        """The expert tiers' hits per tier, bytes moved per token, slot occupancy (spilled MoE)."""
        return self.tiers.tiers.stats.as_dict() if self.tiers is not None else {}

    def memory_info(self) -> dict:
        free, total = self.cp.cuda.runtime.memGetInfo()
        return {"vram_used": total - free, "vram_total": total}

    # ==================================================================== trunk hidden states
    def _hidden_rows(self, kind: str, rows: int, copy: bool):
        """The trunk's last-layer rows of the pass just run: its embedding buffer "x", the
        residual stream every block adds into; a copy where a later pass of the same call
        overwrites the buffer."""
        if not copy:  # last_hidden slices the buffer (a CuPy slice each step is host time nobody may need)
            return kind, rows
        with self.stream:
            return self.buffer(kind + ":x", rows, self.args.hidden_size).copy()

    def last_hidden(self) -> np.ndarray:
        """(T, D): the trunk's last-layer output (before the final norm) of every row of the last
        prefill or step (backends/runner.py), kept on the device; this is the host copy."""
        self.stream.synchronize()
        if not self._hidden:
            return np.zeros((0, self.args.hidden_size), np.float32)
        D = self.args.hidden_size
        return np.concatenate([self.cp.asnumpy(self.buffer(h[0] + ":x", h[1], D) if isinstance(h, tuple) else h)
                               for h in self._hidden])

    # ==================================================================== the MTP head (cuda_mtp.py)
    def mtp_forward(self, ids, hidden, start: int, from_trunk: bool) -> tuple[np.ndarray, np.ndarray]:
        """The MTP head's last row over ``ids`` / ``hidden`` (backends/runner.py; cuda_mtp.CudaMTP.forward)."""
        return self.cuda_mtp.forward(ids, hidden, start, from_trunk)

    def mtp_draft(self, ids, hidden, start: int, k: int, params: SamplingParams | None, seed: int, history) -> list[int]:
        """k drafts from the MTP head (backends/runner.py; cuda_mtp.CudaMTP.draft)."""
        return self.cuda_mtp.draft(ids, hidden, start, k, params, seed, history)


def make_cuda_runner(checkpoint, options, report, tiers=None):
    import cupy as cp

    from ..api import LoadProgress
    from ..models import get_family

    a = get_family(checkpoint.arch).ModelArgs.from_dict(checkpoint.config)
    free, _total = cp.cuda.runtime.memGetInfo()
    budget = int(options.vram_budget_gb * 2**30) if options.vram_budget_gb else free
    # a hybrid model: its recurrent state (with the checkpoint slots) next to the weights, and a
    # KV cache for its attention layers only
    linear = [a.is_linear(i) for i in range(a.num_hidden_layers)] if hasattr(a, "deltanet_spec") else []
    state = dn.state_bytes(a.deltanet_spec(), sum(linear)) if any(linear) else 0
    weights = resident_weight_bytes(checkpoint, tiers) + state
    check_fits(checkpoint.name, weights, budget)
    n_ctx = fit_context(a.max_position_embeddings, options.n_ctx, budget, weights, a.num_hidden_layers - sum(linear),
                        a.num_key_value_heads, a.head_dim, options.kv_cache)
    if n_ctx < min(options.n_ctx or a.max_position_embeddings, a.max_position_embeddings):
        report(LoadProgress("uploading", 0.0, f"context capped at {n_ctx} tokens to fit the VRAM budget"))
    runner = CudaRunner(checkpoint, n_ctx, options.kv_cache, progress=lambda f: report(LoadProgress("uploading", f)),
                        activations=options.activations, tiers=tiers)
    if options.vram_budget_gb:  # the budget caps batched decoding's pool too (kv_pool_room)
        kv = kv_token_bytes(a.num_hidden_layers - sum(linear), a.num_key_value_heads, a.head_dim, options.kv_cache)
        runner.pool_budget = int(budget - weights - RESERVE_BYTES - kv * runner.n_ctx)
    report(LoadProgress("compiling", 0.0, "compiling kernels (cached after the first start) and capturing the decode graph"))
    runner.warmup()
    report(LoadProgress("compiling", 1.0))
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    return runner, name
