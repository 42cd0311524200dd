"""The CUDA runner over several GPUs of one host (``--gpus``): the model split as parallel.py
plans it, one process, one stream per GPU, the exchanges through NCCL (numpy_sharded.py is the
reference of where they go and what each GPU computes between them).

Each GPU runs a CudaRunner of its own over its share of the weights: the model family's
``ModelArgs`` with the GPU's heads, KV heads, MLP width and DeltaNet heads (``local_args``), its
pieces of every tensor (parallel.shard_of), its KV cache and recurrent state, buffers, step
image and decode graphs.  Its op set (``ShardOps``) is CudaOps with the exchanges added where a
GPU holds a partial result:

  embed      each GPU's vocabulary rows, zeros for the ids outside them; all-reduced
  linear     a row-parallel product (attn_o, ffn_down, ssm_out) into a partial buffer,
             all-reduced, then added to the residual stream
  experts    the router replicated (every GPU picks the same experts); each GPU runs the experts
             of its index range (cuda_moe: pointer tables with a row per expert of the layer,
             the others' null and skipped) and its columns of the shared expert onto zeros,
             in the router's ranking order; the partial sums all-reduced into the residual
  lm_head    each GPU's vocabulary range of the logits, all-gathered and put in vocabulary order

An all-reduce is an NCCL all-gather of the GPUs' float32 partials (bytes moved, nothing added)
and the rank-order sum on each GPU (kernels/collective.cu reduce_ranks), so every GPU holds the
same residual stream, samples the same token from the same logits (the sampler is keyed by seed
and position: nothing is broadcast), and the pass is deterministic run to run.  With one GPU the
pass is the single-GPU runner's bit for bit (tests/gpu/test_sharded.py).

The GPUs' plans are traced per GPU (kernel_build.tracing) and walked in lockstep by one host
thread: each GPU's launches up to its next exchange on its own stream, then the exchange of all
GPUs between ``ncclGroupStart`` / ``ncclGroupEnd`` (one thread driving several communicators
must group them).  A decode step of m rows is captured that way once, one CUDA graph per GPU with
its NCCL calls inside, and replayed by launching every GPU's graph in turn.

A QK-norm over the whole projections (MiniMax-M2) is split with the heads: each GPU's sums of
squares of its q and k rows are all-reduced before the norm (rope.cu ss_mode 1, 2).

Not built over several GPUs yet: a checkpoint's MTP head (not loaded: n-gram drafting works),
expert tiers (each GPU's share must fit its VRAM), batched decoding (one sequence at a time).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import numpy as np

from ..api import SamplingParams
from ..options import OptionError
from ..parallel import COLS, VOCAB, PartitionPlan, kv_heads_per_gpu, plan_for, shard_of
from .cuda_deltanet import GDN_CHUNK
from .cuda_opset import CudaLoader, CudaOps
from .kernel_build import device_empty, eager_launches, get_kernel, plan_item


class Comm:
    """NCCL communicators over ``devices`` (one process, ncclCommInitAll).  NVLink SHARP stays off
    (NCCL_NVLS_ENABLE=0): it reduces in the switch in an order of its own, and the multicast it
    needs can take a shared host's GPUs down."""

    def __init__(self, devices):
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # before NCCL reads its environment (the first communicator)
        # every connection made with the communicators, not at a first exchange, which may fall
        # inside a graph capture (NCCL_RUNTIME_CONNECT, NCCL >= 2.22's lazy connection setup)
        os.environ["NCCL_RUNTIME_CONNECT"] = "0"
        from cupy.cuda import nccl

        if not nccl.available:
            raise OptionError(f"--gpus {len(devices)}: this CuPy has no NCCL (pip install nvidia-nccl-cu12 or -cu13)")

        self.nccl, self.devices = nccl, tuple(devices)
        self.comms = nccl.NcclCommunicator.initAll(list(self.devices))

    @contextlib.contextmanager
    def group(self):
        """The exchanges issued inside go out as one NCCL group (one thread, several GPUs)."""
        self.nccl.groupStart()
        try:
            yield
        finally:
            self.nccl.groupEnd()

    def close(self) -> None:
        for c in self.comms:
            c.destroy()
        self.comms = []


class Gather:
    """A plan item: GPU ``rank``'s ``count`` float32 values at ``send`` all-gathered into ``recv``
    ([world][count], rank order) on the current stream.  The lockstep walk issues every GPU's
    Gather of one exchange inside one NCCL group."""

    __slots__ = ("comm", "rank", "send", "recv", "count")

    def __init__(self, comm: Comm, rank: int, send, recv, count: int):
        self.comm, self.rank, self.send, self.recv, self.count = comm, rank, send, recv, count

    def __call__(self) -> None:
        import cupy

        self.comm.comms[self.rank].allGather(self.send.data.ptr, self.recv.data.ptr, self.count,
                                             self.comm.nccl.NCCL_FLOAT32, cupy.cuda.get_current_stream().ptr)


@dataclasses.dataclass
class Shard:
    """What GPU ``rank`` of a split model holds and whom it exchanges with."""

    plan: PartitionPlan
    rank: int
    comm: Comm
    args: object  # the family's ModelArgs with this GPU's heads and widths (local_args)
    tensors: dict  # this GPU's piece of every tensor (parallel.shard_of)

    @property
    def world(self) -> int:
        return self.plan.world


def local_args(args, world: int):
    """The model one GPU computes: H / N query heads, the KV heads they read, F / N hidden units,
    Hk / N and Hv / N DeltaNet heads; the vocabulary stays whole (the logits are gathered)."""
    H, K = args.num_attention_heads, args.num_key_value_heads
    ch = dict(num_attention_heads=H // world, num_key_value_heads=kv_heads_per_gpu(H, K, world), head_dim=args.head_dim,
              intermediate_size=args.intermediate_size // world)
    if hasattr(args, "deltanet_spec"):
        ch.update(linear_num_key_heads=args.linear_num_key_heads // world,
                  linear_num_value_heads=args.linear_num_value_heads // world)
    return dataclasses.replace(args, **ch)


class ShardLoader(CudaLoader):
    """CudaLoader that notes on each weight how the plan splits it (``split``: parallel.py's kind)
    and where its vocabulary range starts (``first``), which ShardOps reads."""

    def __init__(self, shard: Shard):
        super().__init__(None)
        self.shard = shard

    def _tag(self, w, tensors: list):
        s = self.shard.plan.splits[tensors[0].name]
        w.split, w.first = s.kind, (s.ranges[self.shard.rank][0][0] if s.ranges else 0)
        return w

    def load_linear(self, tensors: list, interleave: bool = False, role: str = ""):
        return self._tag(super().load_linear(tensors, interleave, role), tensors)

    def load_embedding(self, tensor):
        return self._tag(super().load_embedding(tensor), [tensor])

    def load_experts(self, gate, up, down, role: str = "experts"):
        """This GPU's range of the layer's routed experts (parallel.shard_of: whole experts), in
        pointer tables with a row for each of the layer's experts (the others' rows null)."""
        from . import cuda_moe as moe

        plan = self.shard.plan
        (lo, _hi), = plan.splits[gate.name].ranges[self.shard.rank]
        ex = moe.load_experts(gate, up, down, first=lo, n_table=plan.shapes[gate.name][0])
        ex.layer = len(self.experts)
        self.experts.append(ex)
        return ex


class ShardOps(CudaOps):
    """CudaOps of one GPU of a split model: the exchanges of the module docstring."""

    def _all_reduce(self, part, out, add: bool) -> None:
        """out (+)= the rank-order sum of every GPU's ``part`` (float32 [rows, n] contiguous)."""
        sh = self.r.shard
        n = part.size
        recv = self.buf("gathered", sh.world * part.shape[-1])  # [world][rows][n] in its bytes
        plan_item(Gather(sh.comm, sh.rank, part, recv, n))
        get_kernel("collective", "reduce_ranks")((-(-n // 256),), (256,), (recv, out, np.int32(sh.world), np.int64(n),
                                                                          np.int32(add)))

    def embed(self, table, ids):
        from . import cuda_linear as lin

        x = self.buf("x", table.in_)
        part = self.buf("embed_part", table.in_)
        lin.embed(table, self.tokens, part, lo=table.first)
        self._all_reduce(part, x, add=False)
        return x

    def linear(self, x, W, residual=None):
        if getattr(W, "split", None) != COLS:
            return super().linear(x, W, residual)
        if residual is None:
            raise ValueError(f"{W.role}: a row-parallel product gives partial sums; the model adds it to the residual")
        residual = self._value(residual)
        part = self.buf((W.role or "linear") + ".part", W.out)
        self._linear(x, W, part)
        self._all_reduce(part, residual, add=True)
        return residual

    def _qk_norm_rope(self, q, k, v, spec, layer: int, bias, q_norm, k_norm, q_rot, split_ss=None):
        """A QK-norm over the whole projections (MiniMax-M2) split with the heads: each GPU's sums of
        squares of its q and k rows, all-reduced, then the norm by the totals over the model's
        heads (numpy_sharded.ShardedOps.rope_kv; rope.cu ss_mode 1, 2)."""
        if spec.qk_norm != "full" or q_norm is None:
            return super()._qk_norm_rope(q, k, v, spec, layer, bias, q_norm, k_norm, q_rot)
        H, K, _ = self.r.shard.plan.heads
        ss = self.buf("qk_ss", 2)
        super()._qk_norm_rope(q, k, v, spec, layer, bias, q_norm, k_norm, q_rot, (ss, 1, H, K))
        self._all_reduce(ss, ss, add=False)
        super()._qk_norm_rope(q, k, v, spec, layer, bias, q_norm, k_norm, q_rot, (ss, 2, H, K))

    def experts(self, x, ids, weights, experts, residual, shared=None):
        """The experts this GPU holds, in the router's ranking order (every GPU routes the same
        rows the same way: the router is replicated), plus its share of the shared expert, onto
        zeros; the GPUs' partial sums all-reduced into the residual stream (numpy_sharded.py)."""
        residual = self._value(residual)
        part = self.buf("moe.part", residual.shape[-1])
        self._experts(x, ids, weights, experts, part, shared, add=False)
        self._all_reduce(part, residual, add=True)
        return residual

    def _lm_head_matvec(self, x, W, out, rows: int):
        return self._gathered_logits(lambda part: super(ShardOps, self)._lm_head_matvec(x, W, part, rows), W, out, rows)

    def lm_head(self, x, W):
        if self.decode or not self.all_logits:
            return super().lm_head(x, W)
        out = device_empty("all_logits", (self.n, self.r.vocab_size), np.float32)
        return self._gathered_logits(lambda part: self._linear(x, W, part), W, out, self.n)

    def _gathered_logits(self, product, W, out, rows: int):
        """GPU r's logits of its vocabulary range (``product(part)``), all-gathered, put in
        vocabulary order into ``out`` (rows of V)."""
        sh, V = self.r.shard, self.r.vocab_size
        if W.split != VOCAB:
            raise ValueError(f"{W.role}: the LM head is split by vocabulary")
        vc = -(-V // sh.world)  # every GPU sends ceil(V / N) logits a row (the last one's [rows][W.out] first)
        if self.decode or not self.all_logits:  # a step's rows, or a prefill's last row: the step's buffers
            part, recv = self.r.buffer("d:lm_part", rows, vc), self.r.buffer("d:lm_gathered", rows, sh.world * vc)
        else:  # every row of a prefill chunk (checks): for this chunk only, as its logits
            part = device_empty("lm_part", (rows, vc), np.float32)
            recv = device_empty("lm_gathered", (rows, sh.world * vc), np.float32)
        product(part.reshape(-1)[:rows * W.out].reshape(rows, W.out))
        plan_item(Gather(sh.comm, sh.rank, part, recv, rows * vc))
        get_kernel("collective", "vocab_gather")((-(-(sh.world * vc) // 256), rows), (256,),
                                                 (recv, out, np.int32(sh.world), np.int32(rows), np.int32(vc), np.int32(V),
                                                  np.int64(out.shape[-1])))
        return out


class ShardedCudaRunner:
    """The runner interface (backends/runner.py) over several GPUs: one CudaRunner per GPU on
    its share (module docstring), driven in lockstep.  One sequence at a time."""

    state_checkpoints = True  # a verify's rollback restores each GPU's recurrent state exactly
    max_batch = 1
    mtp = None
    tiers = None  # no expert tiers over several GPUs

    @property
    def stream(self):
        """GPU 0's stream (bench's CUDA events; every pass ends with all the GPUs synchronized)."""
        return self.ranks[0].stream

    # GPU 0's model, loader and dims (its share: bench's prefill FLOPs and decode bytes are per GPU)
    dims = property(lambda self: self.ranks[0].dims)
    model = property(lambda self: self.ranks[0].model)
    loader = property(lambda self: self.ranks[0].loader)

    @property
    def act_bf16(self) -> bool:
        return self.ranks[0].act_bf16

    @act_bf16.setter
    def act_bf16(self, value: bool) -> None:  # the prefill's contract, set on every GPU (bench's pp rows)
        for rk in self.ranks:
            rk.act_bf16 = value

    def __init__(self, checkpoint, devices, n_ctx: int = 0, kv_type: str = "bf16", prefill_chunk: int = 512,
                 use_graph: bool = True, progress=None, activations: str = "f32", comm=None):
        import cupy as cp

        from .cuda_runner import CudaRunner

        self.cp, self.devices = cp, tuple(devices)
        world = len(self.devices)
        plan = plan_for(checkpoint, world)
        self.args = get_family_args(checkpoint)
        largs = local_args(self.args, world)
        self.comm = comm if comm is not None else Comm(self.devices)  # comm: a test's stand-in
        report = progress or (lambda f: None)
        self.ranks = []
        for r, dev in enumerate(self.devices):
            with cp.cuda.Device(dev):
                shard = Shard(plan, r, self.comm, largs,
                              {n: shard_of(t, plan.splits[n], r) for n, t in checkpoint.tensors.items()})
                self.ranks.append(CudaRunner(checkpoint, n_ctx, kv_type, prefill_chunk, use_graph,
                                             lambda f, r=r: report((r + f) / world), activations, shard=shard))
        lead = self.ranks[0]
        self.n_ctx, self.vocab_size, self.kv_type = lead.n_ctx, lead.vocab_size, kv_type
        self.prefill_chunk, self.use_graph, self.max_rows = prefill_chunk, use_graph, lead.max_rows
        self.graphs: dict = {}  # rows -> every GPU's captured decode step
        self._rows, self._kept = 1, []

    # ------------------------------------------------------------------ the lockstep walk
    @contextlib.contextmanager
    def _on(self, rk):
        with rk.device, rk.stream:
            yield

    def _walk(self, plans: list[list], eager: bool = True) -> None:
        """Every GPU's plan up to its next exchange on its own stream, then that exchange of all
        GPUs as one NCCL group; until the plans end (each holds the same exchanges in order)."""
        idx = [0] * len(plans)
        launches = eager_launches if eager else contextlib.nullcontext
        while True:
            for r, rk in enumerate(self.ranks):
                with self._on(rk), launches():
                    p = plans[r]
                    while idx[r] < len(p) and not isinstance(p[idx[r]], Gather):
                        p[idx[r]]()
                        idx[r] += 1
            if all(i >= len(p) for i, p in zip(idx, plans)):
                return
            if any(i >= len(p) or not isinstance(p[i], Gather) for i, p in zip(idx, plans)):
                raise RuntimeError("the GPUs' plans hold different exchanges")
            with self.comm.group():
                for r, rk in enumerate(self.ranks):
                    with self._on(rk):
                        plans[r][idx[r]]()
                    idx[r] += 1

    def _sync(self) -> None:
        for rk in self.ranks:
            rk.stream.synchronize()

    # ------------------------------------------------------------------ prefill
    def _prefill_chunk(self, ids: np.ndarray, start: int, all_logits: bool):
        self.rollback(start)  # in lockstep here, so that no GPU's _advance recomputes a state alone
        T, plans, outs = len(ids), [], []
        for rk in self.ranks:
            with self._on(rk):
                rk._advance(ids, start)
                rk.p_ids[:T].set(np.asarray(ids, np.int32), stream=rk.stream)
                rk.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32), stream=rk.stream)
                plan, out = rk.prefill_plan(T, start, all_logits)
            plans.append(plan)
            outs.append(out)
        self._walk(plans)
        return outs[0]

    def prefill(self, ids, start: int, params: SamplingParams | None = None, seed: int = 0,
                history: list[int] = ()) -> int | None:
        ids = np.asarray(ids)
        for s in range(0, len(ids), self.prefill_chunk):
            self._prefill_chunk(ids[s: s + self.prefill_chunk], start + s, False)
        self._rows, self._kept = 1, []
        for rk in self.ranks:
            rk._rows, rk._kept, rk._hidden = 1, [], []
        if params is None:
            self._sync()
            return None
        end = start + len(ids)
        hist = [*history[-_ring():], *map(int, ids[:-1][-_ring():])]
        for rk in self.ranks:
            with self._on(rk):
                rk._write_io([int(ids[-1])], end - 1, params, seed, hist)
                rk._h2d_io(1)
                rk._sample_rows(1)
                rk._d2h_tokens(1)
        self._sync()
        return self._tokens(1)[0]

    def prefill_logits(self, ids, start: int, chunk: int | None = None) -> np.ndarray:
        chunk = chunk or self.prefill_chunk
        if chunk > self.prefill_chunk:
            raise ValueError(f"chunk {chunk} > the buffers' {self.prefill_chunk}")
        if self.ranks[0].dn_state is not None and chunk % GDN_CHUNK:
            raise ValueError(f"chunk {chunk}: a multiple of {GDN_CHUNK} for a hybrid model (cuda_deltanet.prefill)")
        ids = np.asarray(ids)
        outs = [self._prefill_chunk(ids[s: s + chunk], start + s, True) for s in range(0, len(ids), chunk)]
        self._sync()
        with self.ranks[0].device:
            return np.concatenate([self.cp.asnumpy(o) for o in outs])

    # ------------------------------------------------------------------ decode
    def _eager_step(self, m: int) -> None:
        """A decode step of m rows launched from the plans (the step image already written)."""
        plans = []
        for rk in self.ranks:
            with self._on(rk):
                rk._h2d_io(m)
                plans.append(rk.plan(m))
        self._walk(plans, eager=False)
        for rk in self.ranks:
            with self._on(rk):
                rk._d2h_tokens(m)

    def _capture(self, m: int) -> None:
        """Every GPU's decode step of m rows as one CUDA graph, captured in lockstep (its NCCL
        calls inside: the communicators connected every protocol when made, Comm)."""
        plans = []
        for rk in self.ranks:
            with rk.device:
                plans.append(rk.plan(m))
        mode = getattr(self.cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        for rk in self.ranks:
            with self._on(rk):
                rk.stream.begin_capture(*(() if mode is None else (mode,)))
        graphs = []
        try:
            for rk in self.ranks:
                with self._on(rk):
                    rk._h2d_io(m)
            self._walk(plans, eager=False)
            for rk in self.ranks:
                with self._on(rk):
                    rk._d2h_tokens(m)
        finally:
            for rk in self.ranks:
                with self._on(rk):
                    graphs.append(rk.stream.end_capture())
        # uploaded before the first launch, which then only enqueues (NCCL warns that a graph
        # launch may block where one thread drives several GPUs; the uploads take that work)
        for rk, graph in zip(self.ranks, graphs):
            with self._on(rk):
                graph.upload(rk.stream)
        self._sync()
        self.graphs[m] = graphs

    def _pass(self, rows: list[int], start: int, params: SamplingParams, seed: int, history, keep: bool = False):
        m = len(rows)
        for rk in self.ranks:
            with rk.device:
                rk._write_io(rows, start, params, seed, history)
        if self.use_graph:
            if m not in self.graphs:
                self._capture(m)
            for rk, graph in zip(self.ranks, self.graphs[m]):
                with self._on(rk):
                    graph.launch(rk.stream)
        else:
            self._eager_step(m)
        self._rows, kept = m, None
        lead = self.ranks[0]
        if keep:
            with self._on(lead):
                kept = lead.d_logits[:m].copy()
        self._sync()
        return kept

    def step(self, tokens, start: int, params: SamplingParams, seed: int, history) -> list[int]:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("a step runs at least one row")
        self.rollback(start)  # in lockstep here, so that no GPU's _advance recomputes a state alone
        for rk in self.ranks:
            with rk.device:
                rk._advance(tokens, start, step=True)
        from .cuda_runner import step_passes

        out, self._kept = step_passes(self, tokens, start, params, seed, history)
        return out

    def _tokens(self, n: int) -> list[int]:
        return self.ranks[0]._tokens(n)  # every GPU sampled the same tokens

    def last_logits(self) -> np.ndarray:
        self._sync()
        lead = self.ranks[0]
        with lead.device:
            if self._kept:
                return np.concatenate([self.cp.asnumpy(k) for k in self._kept])
            return self.cp.asnumpy(lead.d_logits[:self._rows])

    def decode_logits(self, token: int, pos: int) -> np.ndarray:
        self.step([token], pos, SamplingParams(temperature=0), 0, [])
        return self.last_logits()[0]

    def rollback(self, n: int) -> None:
        """Each GPU's state rewound to position n (its KV cache needs nothing: stale positions are
        overwritten before any read).  A recurrent state with no checkpoint slot at n is
        recomputed through the prefill path, in lockstep."""
        lead = self.ranks[0]
        if lead.dn_state is None or n >= lead.state_pos:
            return
        lo, hi = lead._slot_range
        if lo <= n < hi:
            for rk in self.ranks:
                with self._on(rk):
                    rk.rollback(n)
            return
        ids = np.asarray(lead._ids[:n], np.int64)
        for rk in self.ranks:
            with self._on(rk):
                st, rt = rk.dn_state, self.cp.cuda.runtime
                for name in ("conv", "ssm"):
                    rt.memsetAsync(st[name].data.ptr, 0, st[name].nbytes, rk.stream.ptr)
                rk.state_pos, rk._slot_range = 0, (0, 0)
        with self._on(lead):  # the last step's logits outlive the recompute (as CudaRunner.rollback)
            kept = self._kept or [lead.d_logits[:self._rows].copy()]
        for s in range(0, n, self.prefill_chunk):
            self._prefill_chunk(ids[s:s + self.prefill_chunk], s, False)
        self._kept = kept

    # ------------------------------------------------------------------ the rest of the interface
    def last_hidden(self) -> np.ndarray:
        lead = self.ranks[0]  # the residual stream is the same bits on every GPU
        with lead.device:
            return lead.last_hidden()

    def warmup(self) -> None:
        greedy = SamplingParams(temperature=0)
        self.prefill(np.array([0, 1], np.int64), 0, greedy)
        self.step([0], 2, greedy, 0, [])

    def decode_weight_bytes(self) -> int:
        """The bytes the busiest GPU reads a decode step (the GPUs stream theirs at once)."""
        out = []
        for rk in self.ranks:
            with rk.device:
                out.append(rk.decode_weight_bytes())
        return max(out)

    def decode_state_bytes(self) -> int:
        return max(rk.decode_state_bytes() for rk in self.ranks)

    def expert_stats(self) -> dict:
        return {}

    def memory_info(self) -> dict:
        used = total = 0
        for rk in self.ranks:
            with rk.device:
                free, tot = self.cp.cuda.runtime.memGetInfo()
            used, total = used + tot - free, total + tot
        return {"vram_used": used, "vram_total": total}

    def close(self) -> None:
        """The graphs go first: NCCL will not destroy a communicator while a captured graph
        still refers to it (ncclCommDestroy waits for them)."""
        import gc

        self._sync()
        self.graphs.clear()
        gc.collect()
        self.comm.close()


def _ring() -> int:
    from .cuda_runner import RING

    return RING


def make_sharded_runner(checkpoint, options, report) -> tuple[ShardedCudaRunner, str]:
    """The engine's runner over ``options.gpus``: each GPU's share checked against its free memory
    (or --vram-budget, per GPU) before anything loads, the context fitted to the GPU with the least
    room, the kernels compiled and the one-row step captured."""
    import cupy as cp

    from ..api import LoadProgress
    from .cuda_budget import check_fits, fit_context

    gpus, world = tuple(options.gpus), len(options.gpus)
    plan = plan_for(checkpoint, world)
    per = plan.weight_bytes(checkpoint.tensors)
    free = []
    for g in gpus:
        with cp.cuda.Device(g):
            free.append(cp.cuda.runtime.memGetInfo()[0])
    budgets = [int(options.vram_budget_gb * 2**30) if options.vram_budget_gb else f for f in free]
    if plan.n_state_layers:  # a hybrid's recurrent state (with its checkpoint slots) beside the weights
        from ..parallel import local_deltanet
        from .cuda_deltanet import state_bytes

        per = [w + state_bytes(local_deltanet(plan.deltanet, world), plan.n_state_layers) for w in per]
    for g, w, b in zip(gpus, per, budgets):
        check_fits(f"{checkpoint.name} (its share on GPU {g})", w, b)
    a = local_args(get_family_args(checkpoint), world)
    n_ctx = min(fit_context(a.max_position_embeddings, options.n_ctx, b, w, plan.n_kv_layers, a.num_key_value_heads,
                            a.head_dim, options.kv_cache) for w, b in zip(per, budgets))
    runner = ShardedCudaRunner(checkpoint, gpus, n_ctx, options.kv_cache,
                               progress=lambda f: report(LoadProgress("uploading", f)), activations=options.activations)
    report(LoadProgress("compiling", 0.0, "compiling kernels (cached after the first start) and capturing the decode graphs"))
    runner.warmup()
    report(LoadProgress("compiling", 1.0))
    name = cp.cuda.runtime.getDeviceProperties(gpus[0])["name"].decode()
    return runner, f"{world} x {name}"


def get_family_args(checkpoint):
    from ..models import get_family

    return get_family(checkpoint.arch).ModelArgs.from_dict(checkpoint.config)
