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

The forward pass is the model file's (``models/*.py``), run on ``CudaOps``: the op set
(``bw24chat.ops``) on the CUDA kernels.  Values are deferred until their consumer is known, so
that the launches fuse as the kernels allow:
    rmsnorm            -> the next matvec's prologue (decode) / a norm kernel (prefill)
    linear + swiglu    -> the gate|up matvec's epilogue (decode) / GEMM + swiglu_rows (prefill)
    linear(residual=x) -> the matvec's / GEMM's add epilogue, in place in x
    attention -> linear, swiglu -> linear:  on the integer-dot contract the producer also writes
                          the consumer's quantized input codes (QX), which the consumer copies
                          instead of quantizing again (the same bits)
A dense Llama-style block is thus 6 launches per layer in decode: qkv matvec (rmsnorm
prologue), rope + QK-norm + KV write, attention, o matvec (+x), gate|up matvec (rmsnorm
prologue, swiglu epilogue), down matvec (+x); then the LM head matvec and the sampler.
The matvec kernels reduce each row in the same order for m = 1..8, so speculative verify and
batched decode reproduce plain decode bit for bit.

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
recomputes it from the ids through the prefill path.  A DeltaNet layer decodes in 8 launches: the
qkv, b and a matvecs (rmsnorm prologue), conv1d, the recurrence, the z matvec, the gated norm, the
out matvec (+x).  Prefill runs the delta rule chunked (64-row chunks on tensor cores, a short tail
row by row: cuda_deltanet.prefill), so a hybrid model's prefill passes are multiples of 64 rows.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..api import SamplingParams
from ..sampling import REPEAT_WINDOW_MAX
from ..models import get_family
from ..ops import AttentionSpec, Loader, Ops
from . import cuda_deltanet as dn
from . import cuda_linear as lin
from . import cuda_moe as moe
from . import cuda_ops as ops
from .cuda_weights import DeviceWeight, repack_host
from .cuda_weights import upload as upload_planes
from .kernel_build import HostStep, eager_launches, host_step, tracing
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

# The MTP head's step image (pinned on the host, mirrored on the device; CudaRunner.mtp_draft): int32
# arrays of MAX_ROWS each (the catch-up rows' tokens, positions, lengths; the chained rows'
# positions, lengths; each draft's sampling position; the drafts, copied back), the drafts'
# sampling params and ring (one block: each draft is pushed to the ring as it is drawn), then the
# catch-up rows' trunk hidden states.  A pass of m rows copies the image up to its m rows.
_MTP_TOK, _MTP_POS, _MTP_LEN, _MTP_CPOS, _MTP_CLEN, _MTP_SPOS, _MTP_OUT = (i * MAX_ROWS for i in range(7))
_MTP_PARAMS = 256  # bytes
_MTP_RING = _MTP_PARAMS + _ROW_PARAMS
_MTP_HIDDEN = -(-(_MTP_RING + 4 * RING) // 256) * 256


def sampling_rows(tokens, params: SamplingParams, seed: int, history):
    """Per row of tokens[i] (positions start + i): its sampler image (ops.pack_sampling_params)
    and its ring of recent ids, oldest first: the repetition window of ``history`` (the ids
    before the rows) then tokens[:i + 1], at most repeat_last_n (capped at RING) of them."""
    n_hist = min(params.repeat_last_n, RING) if params.repeat_penalty != 1.0 else 0
    recent = [int(t) for t in history[-RING:]]
    for t in tokens:
        recent.append(int(t))
        n = min(len(recent), n_hist)
        yield ops.pack_sampling_params(params, seed, n), (recent[-n:] if n else [])


class CudaLoader(Loader):
    """Uploads weights in their resident layouts (cuda_weights); remembers what it uploaded."""

    def __init__(self, tiers=None):
        import cupy as cp

        self.cp = cp
        self.linears: list[DeviceWeight] = []
        self.experts: list = []  # cuda_moe.CudaExperts of each MoE layer
        self.convs: list = []  # the gated DeltaNet layers' conv1d taps
        self.tiers = tiers  # cuda_tiers.CudaTiers when the experts are spilled from VRAM
        self._planes: dict = {}

    def load_linear(self, tensors: list, interleave: bool = False, role: str = "") -> DeviceWeight:
        # the host repack is memoized on the source arrays: random-weight benchmark models share
        # one set of arrays across layers (each layer still gets its own device copy)
        key = tuple(id(x.raw) for x in tensors) + (interleave,)
        if key not in self._planes:
            self._planes[key] = repack_host(tensors, interleave)
        w = upload_planes(tensors, self._planes[key])
        w.role = role
        self.linears.append(w)
        return w

    def load_vector(self, tensors: list):
        cp = self.cp
        return cp.concatenate([cp.asarray(np.ascontiguousarray(t.dequantize(), np.float32).reshape(-1)) for t in tensors])

    def load_embedding(self, tensor) -> DeviceWeight:
        w = upload_planes([tensor], repack_host([tensor]))
        w.role = "embed"
        return w

    def load_conv(self, tensor):
        w = self.cp.asarray(np.ascontiguousarray(tensor.dequantize(), np.float32).reshape(tensor.shape[0], -1))
        self.convs.append(w)
        return w

    def load_experts(self, gate, up, down, role: str = "experts") -> moe.CudaExperts:
        # VRAM slots of expert images + pointer tables (cuda_moe); spilled: the tier plan's slot count
        slots = self.tiers.tiers.plan.vram_slots[len(self.experts)] if self.tiers is not None else None
        ex = moe.load_experts(gate, up, down, memo=self._planes, slots=slots)
        ex.layer = len(self.experts)
        if self.tiers is not None:
            self.tiers.load(ex)
        self.experts.append(ex)
        return ex


class _Normed:  # rmsnorm(x) * w, not yet computed
    def __init__(self, x, w):
        self.x, self.w = x, w


class _Linear:  # x @ W^T, not yet computed (x may itself be deferred)
    def __init__(self, x, W: DeviceWeight):
        self.x, self.W = x, W


class _Swiglu:  # swiglu(x @ W^T), not yet computed
    def __init__(self, lin_: _Linear):
        self.x, self.W = lin_.x, lin_.W


class _Attention:  # attention(q) of a layer, not yet computed
    def __init__(self, q, spec: AttentionSpec, layer: int):
        self.q, self.spec, self.layer = q, spec, layer


class CudaOps(Ops):
    """The op set on the CUDA kernels for one pass: a decode step of m rows (matvec kernels,
    tokens and positions in the step image on the device) or a prefill chunk of T rows (GEMMs,
    host positions)."""

    def __init__(self, runner: "CudaRunner", rows: int, decode: bool, start: int = 0, all_logits: bool = False):
        self.r, self.n, self.decode, self.start, self.all_logits = runner, rows, decode, start, all_logits
        self.eps = runner.args.rms_norm_eps
        self.xb16 = runner.act_bf16
        if decode:
            self.tokens, self.positions = runner.d_tokens[:rows], runner.d_pos[:rows]
        else:
            self.tokens, self.positions = runner.p_ids[:rows], runner.p_pos[:rows]
        # the KV cache the pass writes and reads, and each row's keys attended (decode); the MTP
        # head's passes bind the head's own (_HeadOps)
        self.cache_k, self.cache_v, self.lengths = runner.cache_k, runner.cache_v, runner.d_len[:rows]
        # a paged pool instead (the batched step, cuda_batch.py): each row's cache row, the block
        # tables (decode: row i's at i * table_stride; prefill: the sequence's), the decode
        # attention's workspace and the rows it is laid out for
        self.kv_rows, self.kv_tables, self.table_stride = None, None, 0
        self.attn_ws, self.attn_rows = runner.attn_ws, ops.DECODE_MAX_ROWS
        self._values: dict = {}  # id -> (deferred value, its buffer) once launched (_value)

    def buf(self, name: str, *cols: int, dtype: str = "f4"):
        return self.r.buffer(("d:" if self.decode else "p:") + name, self.n, *cols, dtype=dtype)

    # ------------------------------------------------------------------ materializing inputs
    def _input(self, v, W: DeviceWeight | None = None, matvec: bool | None = None) -> dict:
        """Launch what ``v`` still owes; the input arguments for consuming it with ``W`` (through
        a matvec: a deferred rmsnorm becomes W's prologue, QX codes its copied input)."""
        m = self.n
        if isinstance(v, _Normed):
            if self.decode if matvec is None else matvec:
                return dict(x=v.x, prologue="rmsnorm", norm_w=v.w, eps=self.eps)
            h = self.buf("h", v.x.shape[-1])
            ops.rmsnorm(v.x, v.w, self.eps, h)
            return dict(x=h)
        qx_ok = self.decode and W is not None and lin.takes_qx(W, m)
        if isinstance(v, _Swiglu):
            F = v.W.out // 2
            act = self.buf("act", F)
            if not self.decode:
                gu = self.buf(v.W.role or "gu", v.W.out)
                self._linear(v.x, v.W, gu)
                ops.swiglu(gu, act)
                return dict(x=act)
            # gate|up writes the consumer's x codes where its tiles cover whole 32-input blocks
            qx = self.buf("qx_act", lin.qx_row_words(F - F % 32), dtype="u4") \
                if qx_ok and lin.writes_qx(v.W, m) else None
            self._linear(v.x, v.W, act, epilogue="swiglu", qx_out=qx)
            return dict(x=act, prologue="qx", qx_in=qx) if qx is not None else dict(x=act)
        if isinstance(v, _Attention):
            s, r = v.spec, self.r
            H, hd = s.n_heads, s.head_dim
            out = self.buf("attn", H, hd)
            if not self.decode:
                ops.attn_prefill(v.q, self.cache_k[v.layer], self.cache_v[v.layer], r.kv_type, self.start, m, s.scale, out,
                                 table=self.kv_tables)
                return dict(x=out.reshape(m, H * hd))
            qa = self.buf("qx_attn", lin.qx_row_words(H * hd), dtype="u4") \
                if qx_ok and r.attn_qx and (H * hd) % 32 == 0 else None
            ops.attn_decode(v.q, self.cache_k[v.layer], self.cache_v[v.layer], r.kv_type, self.lengths, m, s.scale, out,
                            self.attn_ws, self.attn_rows, qx_out=qa, act_bf16=self.xb16, tables=self.kv_tables,
                            table_stride=self.table_stride)
            x = out.reshape(m, H * hd)
            return dict(x=x, prologue="qx", qx_in=qa) if qa is not None else dict(x=x)
        if isinstance(v, _Linear):
            out = self.buf(v.W.role or "linear", v.W.out)
            self._linear(v.x, v.W, out)
            return dict(x=out)
        return dict(x=v)

    def _value(self, v):
        """v's values in a buffer: what a deferred value still owes is launched, once (a value may
        feed two ops: the MTP head's eh_proj output is its block's first norm input and its
        residual; a norm of a norm (the head's hnorm of the trunk's final norm) needs the first)."""
        if not isinstance(v, (_Normed, _Linear, _Swiglu, _Attention)):
            return v
        if id(v) not in self._values:
            if isinstance(v, _Normed):
                h = self.buf("hn", v.x.shape[-1])
                ops.rmsnorm(v.x, v.w, self.eps, h)
            else:
                h = self._input(v, matvec=False)["x"]
            self._values[id(v)] = (v, h)  # the value is kept alive with its id
        return self._values[id(v)][1]

    def _linear(self, x, W: DeviceWeight, out, epilogue: str = "store", qx_out=None) -> None:
        a = self._input(x, W)
        if self.decode:
            lin.matvec(W, a.pop("x"), out, self.n, epilogue=epilogue, qx_out=qx_out, act_bf16=self.xb16, **a)
        else:
            lin.gemm(W, a["x"], out, self.n, epilogue=epilogue, act_bf16=self.xb16)

    # ------------------------------------------------------------------ the op set
    def embed(self, table: DeviceWeight, ids):
        x = self.buf("x", table.in_)
        lin.embed(table, self.tokens, x)
        return x

    def rmsnorm(self, x, w):
        return _Normed(self._value(x), w)

    def concat(self, a, b):
        # one launch (norm.cu rmsnorm_concat) computes both halves' deferred rmsnorms into column
        # slices of one buffer, so the product after it is one matvec / GEMM over Da + Db inputs
        (xa, wa), (xb, wb) = ((v.x, v.w) if isinstance(v, _Normed) else (self._value(v), None) for v in (a, b))
        out = self.buf("concat", xa.shape[-1] + xb.shape[-1])
        ops.rmsnorm_concat(xa, wa, xb, wb, self.eps, out)
        return out

    def linear(self, x, W: DeviceWeight, residual=None):
        if residual is None:
            return _Linear(x, W)
        residual = self._value(residual)
        self._linear(x, W, residual, epilogue="add")
        return residual

    def swiglu(self, gu):
        if not isinstance(gu, _Linear):
            raise TypeError("swiglu takes the gate|up linear directly (it is fused into its epilogue)")
        return _Swiglu(gu)

    def rope_kv(self, qkv, spec: AttentionSpec, layer: int, bias=None, q_norm=None, k_norm=None):
        r, T = self.r, self.n
        H, K, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        qkv = self._value(qkv)  # (output_gate reads its gate half later)
        qw = (2 if spec.output_gate else 1) * H * hd  # the q projection (per head [q | gate] when gated)
        q = qkv[:, :qw].reshape(T, H, qw // H)[:, :, :hd]  # column slices of the fused output
        k = qkv[:, qw:qw + K * hd].reshape(T, K, hd)
        v = qkv[:, qw + K * hd:].reshape(T, K, hd)
        q_rot = self.buf("q", H, hd)
        cos, sin = r.rope_tables(spec.rope)
        ops.qk_norm_rope_kv_write(q, k, v, q_norm, k_norm, spec.eps, cos, sin, self.positions, spec.rope.style,
                                  spec.rope.rot_dim, self.cache_k[layer], self.cache_v[layer], r.kv_type, bias=bias,
                                  q_out=q_rot, qk_norm=spec.qk_norm, q_gated=spec.output_gate, cache_rows=self.kv_rows)
        return q_rot

    def attention(self, q, spec: AttentionSpec, layer: int):
        return _Attention(q, spec, layer)

    def output_gate(self, o, qkv, spec: AttentionSpec):
        # the attention's plain output (no QX codes: the gate changes the values the o projection
        # quantizes), scaled in place
        x = self._input(o, matvec=False)["x"]
        ops.output_gate(x, self._value(qkv), spec.n_heads, spec.head_dim)
        return x

    # ------------------------------------------------------------------ gated DeltaNet (cuda_deltanet)
    def _slots(self, name: str, layer: int) -> tuple:
        """(positions, the layer's checkpoint slots) of a decode pass, (None, None) for prefill."""
        return (self.positions, self.r.dn_state[name][:, layer]) if self.decode else (None, None)

    def causal_conv1d(self, x, w, spec, layer: int):
        out = self.buf("ssm_conv", spec.conv_dim)
        dn.conv1d(self._input(x)["x"], w, self.r.dn_state["conv"][layer], out, self.n, *self._slots("conv_ckpt", layer))
        return out

    def gated_delta_rule(self, qkv, b, a, A, dt_bias, spec, layer: int):
        o = self.buf("ssm_o", spec.n_v_heads * spec.v_head_dim)
        args = (self._value(qkv), self._input(b)["x"], self._input(a)["x"], A, dt_bias, spec, self.r.dn_state["ssm"][layer], o)
        if self.decode:
            dn.recurrent(*args, self.n, *self._slots("ssm_ckpt", layer))
        else:  # chunked on tensor cores, a short tail row by row (cuda_deltanet.prefill)
            chunks = -(-self.n // dn.GDN_CHUNK)
            ws = {k: self.r.buffer("p:dn_" + k, chunks, cols) for k, (_, cols) in dn.chunk_workspace_shapes(spec, chunks).items()}
            dn.prefill(*args, self.n, ws["ws"], ws["qk"])
        return o

    def gated_rmsnorm(self, x, z, w, spec):
        out = self.buf("ssm_y", spec.n_v_heads * spec.v_head_dim)
        dn.gated_norm(self._value(x), self._input(z)["x"], w, spec.eps, out, spec, self.n)
        return out

    def router(self, x, gate: DeviceWeight, spec, bias=None):
        m, k = self.n, spec.top_k
        logits = self.buf("moe_logits", spec.n_experts)
        self._linear(x, gate, logits)  # the dense matvec / GEMM (decode: the rmsnorm as its prologue)
        ids = self.buf("moe_ids", k, dtype="i4")
        w = self.buf("moe_w", k)
        moe.router(logits, bias, ids, w, m, spec)
        return ids, w

    def experts(self, x, ids, weights, experts, residual, shared=None):
        m, k = ids.shape
        D = residual.shape[-1]
        sh = None
        if shared is not None:
            gu_s, down_s, gate_s = shared
            sh = self.buf("moe_shared", D)  # the dense MLP on the dense matvec / GEMM path
            self._linear(_Swiglu(_Linear(x, gu_s)), down_s, sh)
            if gate_s is not None:  # Qwen2-MoE / Qwen3-Next: scaled by sigmoid(x . gate_s), x normed
                ops.shared_gate(sh, self._value(x), gate_s)
        if not self.decode:
            h = self._input(x, matvec=False)["x"]
            run = lambda stream=None: moe.prefill_experts(experts, h, ids, weights, sh, residual, m, k,
                                                          act_bf16=self.xb16)
            if experts.tiers is not None:  # spilled: the streamed experts follow the routing, read on the host
                host_step(run, f"experts of MoE layer {experts.layer}")
            else:  # resident: grouped on the device (moe_group), all launches of the plan
                run()
            return residual
        if experts.tiers is not None:  # spilled: the routed experts are copied into VRAM slots first
            host_step(lambda stream: experts.tiers.fetch(experts, ids, m, stream), f"experts of MoE layer {experts.layer}")
        a = self._input(x)
        F = experts.gu.out // 2
        act = self.buf("moe_act", k, F)
        moe.experts_gu(experts, a["x"], ids, act, m, k, norm_w=a.get("norm_w"), eps=self.eps, xb16=self.xb16)
        moe.experts_down(experts, act, ids, weights, sh, residual, m, k, xb16=self.xb16)
        return residual

    def lm_head(self, x, W: DeviceWeight):
        r, V = self.r, W.out
        if self.decode or not self.all_logits:
            # prefill: only the last row, through the decode path's LM head into logits row 0
            rows = self.n if self.decode else 1
            if not self.decode:
                x = _Normed(x.x[self.n - 1:self.n], x.w) if isinstance(x, _Normed) else x[self.n - 1:self.n]
            a = self._input(x, W, matvec=True)
            out = r.d_logits[:rows]
            lin.matvec(W, a.pop("x"), out, rows, act_bf16=self.xb16, **a)
            return out
        out = self.r.cp.empty((self.n, V), self.r.cp.float32)
        self._linear(x, W, out)
        return out


class _HeadOps(CudaOps):
    """The op set for one decode pass of the MTP head (models/mtp.py): its rows' tokens,
    positions and lengths from the head's step image (``tokens``: a catch-up pass's, or the
    draft a chained row embeds), the head's one-layer KV cache, buffers of its own (the trunk's
    rows stay readable: last_hidden), and the LM head on the last row only, into
    ``runner.mtp_logits`` (none at all for a pass that only fills the head's cache)."""

    def __init__(self, runner: "CudaRunner", rows: int, tokens, positions, lengths, logits: bool):
        super().__init__(runner, rows, decode=True)
        self.tokens, self.positions, self.lengths = tokens, positions, lengths
        self.cache_k, self.cache_v = [runner.mtp_cache_k], [runner.mtp_cache_v]
        self.logits = logits

    def buf(self, name: str, *cols: int, dtype: str = "f4"):
        return self.r.buffer("d:mtp." + name, self.n, *cols, dtype=dtype)

    def lm_head(self, x, W: DeviceWeight):
        if not self.logits:
            return None
        x = _Normed(x.x[self.n - 1:], x.w) if isinstance(x, _Normed) else self._value(x)[self.n - 1:]
        a = self._input(x, W, matvec=True)
        lin.matvec(W, a.pop("x"), self.r.mtp_logits, 1, act_bf16=self.xb16, **a)
        return self.r.mtp_logits


class CudaRunner:
    """The runner interface (backends/runner.py) on one GPU."""

    state_checkpoints = True  # speculative.make_drafter: a verify's rollback restores a recurrent state exactly

    def __init__(self, checkpoint, n_ctx: int = 0, kv_type: str = "bf16", prefill_chunk: int = 512,
                 use_graph: bool = True, progress=None, activations: str = "f32", tiers=None):
        import cupy as cp

        self.cp = cp
        fam = get_family(checkpoint.arch)
        a = self.args = fam.ModelArgs.from_dict(checkpoint.config)
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
        self.loader = CudaLoader(cuda_tiers)
        report = progress or (lambda f: None)
        self.model = fam.Model(a, self.loader, checkpoint.tensors, self.n_ctx, report)
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
        self.sample_ws = cp.zeros(ops.sample_workspace_bytes(a.vocab_size), cp.uint8)
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
        self._kept: list = []  # the logits of each pass of a step over more than MAX_ROWS rows
        self._hidden: list = []  # the trunk's last-layer rows of the last prefill / step, per pass (last_hidden)
        self.batch = None  # init_kv_pool: the paged pool and the batched step (cuda_batch.py)
        self.pool_budget: int | None = None  # kv_pool_room's cap: what the fit left of a VRAM budget
        self._init_mtp(checkpoint)
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
            out = self.model.forward(CudaOps(self, T, decode=False, start=start, all_logits=all_logits), self.p_ids[:T])
        return plan, out

    def _prefill_chunk(self, ids: np.ndarray, start: int, all_logits: bool):
        """One prefill chunk: its ids and positions to the device, then a walk over its plan."""
        T = len(ids)
        self._advance(ids, start)
        self.p_ids[:T].set(np.asarray(ids, np.int32), stream=self.stream)
        self.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32), stream=self.stream)
        plan, out = self.prefill_plan(T, start, all_logits)
        with eager_launches():  # host-launched: CuPy's cheaper launch path (kernel_build)
            for item in plan:
                item()
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
        for i in range(m):
            row = self.d_io[_HDR_BYTES + i * _ROW_BYTES:_HDR_BYTES + (i + 1) * _ROW_BYTES]
            ops.sample(self.d_logits[i], row[:_ROW_PARAMS].view(self.cp.uint64), self.d_next[i:i + 1],
                       row[_ROW_PARAMS:].view(self.cp.int32), self.d_len[i:i + 1], self.sample_ws)

    def plan(self, m: int = 1) -> list:
        """The launches of a decode step of m rows, in order: the model's forward on CudaOps and
        the sampler, traced once (kernel_build.tracing: kernels bound to the runner's buffers,
        nothing launched) and walked by every step; ``backends/plan.py`` derives the same list
        from the dims and GPU properties alone."""
        p = self.plans.get(m)
        if p is None:
            with self.stream, tracing() as p:
                self.model.forward(CudaOps(self, m, decode=True), self.d_tokens[:m])
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
        h = self.h_i32
        for i, (t, (packed, ring)) in enumerate(zip(tokens, sampling_rows(tokens, params, seed, history))):
            h[_HDR_TOKEN // 4 + i] = int(t)
            h[_HDR_POS // 4 + i] = start + i
            h[_HDR_LEN // 4 + i] = start + i + 1
            base = _HDR_BYTES + i * _ROW_BYTES
            np.frombuffer(self.h_io, np.uint64, ops.SAMPLE_PARAM_WORDS, base)[:] = packed
            if ring:
                h[(base + _ROW_PARAMS) // 4:(base + _ROW_PARAMS) // 4 + len(ring)] = ring

    def step(self, tokens, start: int, params: SamplingParams, seed: int, history) -> list[int]:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("a step runs at least one row")
        self._advance(tokens, start, step=True)
        # more rows than one pass holds (a verify of K = 8 drafts; spilled experts): passes of
        # max_rows rows, each row still the same arithmetic as a one-row step
        out, kept, hidden = [], [], []
        hist = list(history[-RING:])
        P = self.max_rows
        for s in range(0, len(tokens), P):
            rows = tokens[s:s + P]
            if kept or s + P < len(tokens):
                kept.append(self._pass(rows, start + s, params, seed, hist, keep=True))
            else:
                self._pass(rows, start + s, params, seed, hist)
            out += [int(t) for t in self.h_i32[_HDR_OUT // 4:_HDR_OUT // 4 + len(rows)]]
            hist += rows
            hidden.append(self._hidden_rows("d", len(rows), s + P < len(tokens)))
        self._kept, self._hidden = kept, hidden
        return out

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
        self._rows = m
        with self.stream:  # the copy follows the step on the runner's stream
            kept = self.d_logits[:m].copy() if keep else None
        self.stream.synchronize()
        return kept

    def last_logits(self) -> np.ndarray:
        self.stream.synchronize()
        if self._kept:
            return np.concatenate([self.cp.asnumpy(k) for k in self._kept])
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
        # MoE: top_k experts of each layer (gate|up and down)
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
        x = self.buffer(kind + ":x", rows, self.args.hidden_size)
        if not copy:
            return x
        with self.stream:
            return x.copy()

    def last_hidden(self) -> np.ndarray:
        """(T, D): the trunk's last-layer output (before the final norm) of every row of the last
        prefill or step (backends/runner.py), kept on the device; this is the host copy."""
        self.stream.synchronize()
        if not self._hidden:
            return np.zeros((0, self.args.hidden_size), np.float32)
        return np.concatenate([self.cp.asnumpy(h) for h in self._hidden])

    # ==================================================================== the MTP head
    def _init_mtp(self, checkpoint) -> None:
        """The checkpoint's MTP head (models/mtp.py) with its own one-layer KV cache, step image and
        graphs, or ``mtp = None``.  Its weights load through a loader of their own, so that
        decode_weight_bytes stays the trunk's."""
        from ..models.mtp import load_mtp

        self.mtp = load_mtp(self.model, CudaLoader(), checkpoint.mtp)
        if self.mtp is None:
            return
        cp, a = self.cp, self.args
        self.mtp_cache_k = ops.kv_cache_alloc(self.kv_type, self.n_ctx, a.num_key_value_heads, a.head_dim)
        self.mtp_cache_v = ops.kv_cache_alloc(self.kv_type, self.n_ctx, a.num_key_value_heads, a.head_dim)
        self.mtp_logits = cp.zeros((1, a.vocab_size), cp.float32)
        self.mtp_g = cp.zeros((1, a.hidden_size), cp.float32)  # the last row's g: what a chained row takes
        n = _MTP_HIDDEN + MAX_ROWS * 4 * a.hidden_size
        self.h_mtp = cp.cuda.alloc_pinned_memory(n)
        self.d_mtp = cp.zeros(n, cp.uint8)
        self.h_mtp_i32 = np.frombuffer(self.h_mtp, np.int32, _MTP_PARAMS // 4)
        i32 = self.d_mtp[:_MTP_PARAMS].view(cp.int32)
        self.mtp_io = {name: i32[o:o + MAX_ROWS] for name, o in (("tok", _MTP_TOK), ("pos", _MTP_POS), ("len", _MTP_LEN),
                       ("cpos", _MTP_CPOS), ("clen", _MTP_CLEN), ("spos", _MTP_SPOS), ("out", _MTP_OUT))}
        self.mtp_io.update(params=self.d_mtp[_MTP_PARAMS:_MTP_RING].view(cp.uint64),
                           ring=self.d_mtp[_MTP_RING:_MTP_RING + 4 * RING].view(cp.int32),
                           hidden=self.d_mtp[_MTP_HIDDEN:].view(cp.float32).reshape(MAX_ROWS, a.hidden_size))
        self.mtp_plans: dict = {}  # ("pass", rows, from_trunk, logits) / ("chain", rows) -> the traced plan
        self.mtp_graphs: dict = {}  # the same keys -> the captured plan

    def _mtp_write(self, ids, hidden, start: int, k: int, params: SamplingParams, seed: int, history) -> None:
        """The head's step image for one pass: rows ids[i] with hidden[i] at positions start + i;
        the k - 1 chained rows after the last (positions last + 1 + j); the drafts' sampling (draft
        j is the token at position last + 2 + j, drawn after ``history`` + the drafts before it)."""
        h, m = self.h_mtp_i32, len(ids)
        last = start + m - 1
        h[_MTP_TOK:_MTP_TOK + m] = ids
        h[_MTP_POS:_MTP_POS + m] = np.arange(start, start + m)
        h[_MTP_LEN:_MTP_LEN + m] = np.arange(start + 1, start + m + 1)
        h[_MTP_CPOS:_MTP_CPOS + k - 1] = np.arange(last + 1, last + k)
        h[_MTP_CLEN:_MTP_CLEN + k - 1] = np.arange(last + 2, last + k + 1)
        h[_MTP_SPOS:_MTP_SPOS + k] = np.arange(last + 2, last + k + 2)
        n_hist = min(params.repeat_last_n, RING) if params.repeat_penalty != 1.0 else 0
        recent = [int(t) for t in history[-n_hist:]] if n_hist else []
        np.frombuffer(self.h_mtp, np.uint64, ops.SAMPLE_PARAM_WORDS, _MTP_PARAMS)[:] = \
            ops.pack_sampling_params(params, seed, len(recent), push=True)
        if recent:
            np.frombuffer(self.h_mtp, np.int32, len(recent), _MTP_RING)[:] = recent
        D = self.args.hidden_size
        np.frombuffer(self.h_mtp, np.float32, m * D, _MTP_HIDDEN)[:] = np.asarray(hidden, np.float32).reshape(-1)

    def _copy(self, dst: int, src: int, nbytes: int, kind: int):
        """A copy on the runner's stream as an entry of a head plan (a memcpy node when captured)."""
        return partial(self.cp.cuda.runtime.memcpyAsync, dst, src, nbytes, kind, self.stream.ptr)

    def _mtp_pass(self, plan: list, m: int, from_trunk: bool, logits: bool) -> None:
        """Trace one head pass over the image's m catch-up rows into ``plan``: H2D image -> the
        head -> the last row's g kept -> (its logits -> draft 0 -> D2H)."""
        rt, io, D = self.cp.cuda.runtime, self.mtp_io, self.args.hidden_size
        plan.append(self._copy(self.d_mtp.data.ptr, self.h_mtp.ptr, _MTP_HIDDEN + m * 4 * D, rt.memcpyHostToDevice))
        hops = _HeadOps(self, m, io["tok"][:m], io["pos"][:m], io["len"][:m], logits)
        out, g = self.mtp.forward(hops, hops.tokens, io["hidden"][:m], from_trunk)
        g = hops._value(g)  # (a deferred norm where the head chains its normed output: Qwen3-Next)
        plan.append(self._copy(self.mtp_g.data.ptr, g[m - 1].data.ptr, 4 * D, rt.memcpyDeviceToDevice))
        if logits:
            self._mtp_sample(out, 0)
            plan.append(self._copy(self.h_mtp.ptr + 4 * _MTP_OUT, io["out"].data.ptr, 4, rt.memcpyDeviceToHost))

    def _mtp_chain(self, plan: list, n: int) -> None:
        """Trace n chained head rows after a pass into ``plan``: row j embeds draft j (the
        sampler's output, on the device), takes the previous row's g and draws draft j + 1; then
        D2H of the n + 1 drafts."""
        rt, io, D = self.cp.cuda.runtime, self.mtp_io, self.args.hidden_size
        for j in range(n):
            hops = _HeadOps(self, 1, io["out"][j:j + 1], io["cpos"][j:j + 1], io["clen"][j:j + 1], True)
            out, g = self.mtp.forward(hops, hops.tokens, self.mtp_g, False)
            g = hops._value(g)
            plan.append(self._copy(self.mtp_g.data.ptr, g[0].data.ptr, 4 * D, rt.memcpyDeviceToDevice))
            self._mtp_sample(out, j + 1)
        plan.append(self._copy(self.h_mtp.ptr + 4 * _MTP_OUT, io["out"].data.ptr, 4 * (n + 1), rt.memcpyDeviceToHost))

    def _mtp_sample(self, logits, j: int) -> None:
        io = self.mtp_io
        ops.sample(logits[0], io["params"], io["out"][j:j + 1], io["ring"], io["spos"][j:j + 1], self.sample_ws)

    def mtp_plan(self, key: tuple) -> list:
        """The launches and copies of a head pass (key ("pass", rows, from_trunk, logits)) or of a
        chain (("chain", rows)), traced once (kernel_build.tracing) like the decode step's plan."""
        p = self.mtp_plans.get(key)
        if p is None:
            with self.stream, tracing() as p:
                if key[0] == "pass":
                    self._mtp_pass(p, *key[1:])
                else:
                    self._mtp_chain(p, *key[1:])
            self.mtp_plans[key] = p
        return p

    def _mtp_run(self, key: tuple) -> None:
        """Walk a head plan on the runner's stream: its graph (captured at the first use), or eagerly."""
        plan = self.mtp_plan(key)
        with self.stream:
            if not self.use_graph:
                for item in plan:
                    item()
                return
            graph = self.mtp_graphs.get(key)
            if graph is None:
                self.stream.begin_capture()
                try:
                    for item in plan:
                        item()
                finally:
                    graph = self.mtp_graphs[key] = self.stream.end_capture()
            graph.launch(self.stream)

    def _mtp_rows(self, ids, hidden, start: int, from_trunk: bool, k: int, params: SamplingParams, seed: int,
                  history) -> None:
        """The head over rows ids[i] / hidden[i] at positions start + i, in passes of at most
        MAX_ROWS rows (each row the same arithmetic as a one-row pass); the last pass draws draft
        0 and, for k > 1, the chain of k - 1 rows draws the others."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("an MTP pass runs at least one row")
        if not 1 <= k <= MAX_ROWS:
            raise ValueError(f"{k} drafts: the head's image holds 1..{MAX_ROWS}")
        for s in range(0, len(ids), MAX_ROWS):
            rows, last = ids[s:s + MAX_ROWS], s + MAX_ROWS >= len(ids)
            m = len(rows)
            self._mtp_write(rows, hidden[s:s + m], start + s, k, params, seed, history)
            self._mtp_run(("pass", m, from_trunk, last))
            if not last:
                self.stream.synchronize()  # the next pass rewrites the image
        if k > 1:
            self._mtp_run(("chain", k - 1))
        self.stream.synchronize()

    def mtp_forward(self, ids, hidden, start: int, from_trunk: bool) -> tuple[np.ndarray, np.ndarray]:
        """The MTP head over rows pairing ``ids`` with ``hidden`` (host, (T, D)) at positions
        start.. in its own KV cache: host copies of (logits (V,), g (D,)) of the last row
        (backends/runner.py)."""
        self._mtp_rows(ids, hidden, start, from_trunk, 1, SamplingParams(temperature=0), 0, [])
        return self.cp.asnumpy(self.mtp_logits[0]), self.cp.asnumpy(self.mtp_g[0])

    def mtp_draft(self, ids, hidden, start: int, k: int, params: SamplingParams | None, seed: int, history) -> list[int]:
        """k drafts from the MTP head (backends/runner.py): the catch-up rows (ids[i] with the trunk's
        hidden[i] at start + i), then k - 1 chained rows, each draft drawn on the device as the
        trunk draws its token at that position; one synchronization, the drafts read back."""
        self._mtp_rows(ids, hidden, start, True, k, params or SamplingParams(temperature=0), seed, history)
        return [int(t) for t in self.h_mtp_i32[_MTP_OUT:_MTP_OUT + k]]


KV_BYTES_PER_VALUE = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0, "f32": 4.0}
# activation buffers, workspaces, prefill scratch (the wgmma GEMM's dequantized weight planes
# included), CUDA context slack
RESERVE_BYTES = (3 << 29) + lin.WGP_SCRATCH_BYTES


def kv_token_bytes(n_layers: int, n_kv: int, head_dim: int, kv_type: str) -> float:
    """Bytes of K and V per position over every layer (an fp8 row adds its f32 scale)."""
    return 2 * n_layers * n_kv * (head_dim * KV_BYTES_PER_VALUE[kv_type] + (4 if kv_type == "fp8" else 0))


def fit_context(max_ctx: int, requested: int, budget_bytes: int, weight_bytes: int, n_layers: int, n_kv: int,
                head_dim: int, kv_type: str) -> int:
    """The context the KV cache can hold: the request (or the model's maximum) capped by what is
    left of the VRAM budget after the weights and a reserve, in multiples of 256 (at least 256).
    The context comes first: batched decoding's pool takes what is left after it (pool_room)."""
    want = min(requested or max_ctx, max_ctx)
    fits = int((budget_bytes - weight_bytes - RESERVE_BYTES) // kv_token_bytes(n_layers, n_kv, head_dim, kv_type))
    return max(256, min(want, fits) // 256 * 256) if fits < want else want


def pool_room(free: int, budget_left: int | None, step_bytes: int, n_ctx: int) -> tuple[int, str]:
    """Bytes batched decoding's pool blocks may take, and where the figure comes from: ``free``
    bytes of VRAM now (after the weights, the context's cache and the warm-up), of which the engine
    keeps RESERVE_BYTES free as fit_context keeps them of the budget, capped by ``budget_left`` (a
    --vram-budget less the weights, the cache and the reserve; None: no budget), less
    ``step_bytes`` for the batched step's own buffers."""
    gib = 2**30
    room = free - RESERVE_BYTES
    why = (f"{free / gib:.2f} GiB of VRAM free after the model and its {n_ctx}-token cache, less the engine's "
           f"{RESERVE_BYTES / gib:.2f} GiB reserve")
    if budget_left is not None and budget_left < room:
        room = budget_left
        why = f"the VRAM budget leaves {budget_left / gib:.2f} GiB after the model, its {n_ctx}-token cache and the reserve"
    return room - step_bytes, f"{why} and {step_bytes / gib:.2f} GiB for the batched step's buffers"


def check_fits(name: str, weight_bytes: int, budget_bytes: int) -> None:
    """Refuse, before anything is uploaded, a model whose resident weights the VRAM budget cannot
    hold (MoE experts beyond it were already planned into slots by expert_tiers, or refused
    there), with the numbers and what would run."""
    from .expert_tiers import DoesNotFit

    gib = 2**30
    if weight_bytes + RESERVE_BYTES > budget_bytes:
        raise DoesNotFit(f"{name}: the weights take {weight_bytes / gib:.1f} GiB and the engine {RESERVE_BYTES / gib:.1f} "
                         f"GiB more, but the VRAM budget is {budget_bytes / gib:.1f} GiB: choose a smaller format "
                         "(--quantize nvfp4 or q8_0), a smaller model, or --device cpu")


def resident_weight_bytes(checkpoint, tiers=None) -> int:
    """The bytes of weights the runner keeps in VRAM: all of them, or with spilled experts the
    other weights plus the expert slots."""
    if tiers is None:
        return checkpoint.nbytes
    lay, plan = tiers.layout, tiers.plan
    return lay.other_bytes + sum(s * b for s, b in zip(plan.vram_slots, lay.expert_bytes))


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
