"""The op set (``bw24chat.ops``) on the CUDA kernels: ``CudaOps``, on which the model file's
forward pass (``models/*.py``) runs for one pass of the runner (cuda_runner.py), of its batched
step (cuda_batch.py) or of the MTP head (cuda_mtp.py), and which ``backends/plan.py`` traces
without a GPU; and ``CudaLoader``, which uploads the weights the ops read.

Values are deferred until their consumer is known, so that the launches fuse as the kernels allow:
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

A gated DeltaNet layer (models/qwen3_next.py) decodes in 8 launches: the qkv, b and a matvecs
(rmsnorm prologue), conv1d, the recurrence, the z matvec, the gated norm, the out matvec (+x).
Prefill runs the delta rule chunked (64-row chunks on tensor cores, a short tail row by row:
cuda_deltanet.prefill), so a hybrid model's prefill passes are multiples of 64 rows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import AttentionSpec, Loader, Ops
from . import cuda_deltanet as dn
from . import cuda_linear as lin
from . import cuda_moe as moe
from . import cuda_ops as ops
from . import kernel_build
from .cuda_weights import DeviceWeight, PartedWeight, format_runs
from .cuda_weights import upload as upload_planes
from .kernel_build import host_step

if TYPE_CHECKING:
    from .cuda_runner import CudaRunner


class CudaLoader(Loader):
    """Uploads weights in their resident layouts (cuda_weights); remembers what it uploaded."""

    def __init__(self, tiers=None):
        import cupy as cp

        self.cp = cp
        self.linears: list[DeviceWeight] = []
        self.experts: list = []  # cuda_moe.CudaExperts of each MoE layer
        self.convs: list = []  # the gated DeltaNet layers' conv1d taps
        self.tiers = tiers  # cuda_tiers.CudaTiers when the experts are spilled from VRAM

    def load_linear(self, tensors: list, interleave: bool = False, role: str = "") -> DeviceWeight | PartedWeight:
        runs = format_runs(tensors, interleave)
        if len(runs) > 1:
            return PartedWeight([self.load_linear(r, role=role) for r in runs], role)
        w = upload_planes(tensors, interleave=interleave)
        w.role = role
        self.linears.append(w)
        return w

    def load_vector(self, tensors: list):
        cp = self.cp
        return cp.concatenate([cp.asarray(np.ascontiguousarray(t.dequantize(), np.float32).reshape(-1)) for t in tensors])

    def load_embedding(self, tensor) -> DeviceWeight:
        w = upload_planes([tensor])
        w.role = "embed"
        return w

    def load_vocab_map(self, ids, vocab_size: int):
        from .numpy_backend import vocab_map_ref

        return self.cp.asarray(vocab_map_ref(ids, vocab_size))

    def load_conv(self, tensor):
        w = self.cp.asarray(np.ascontiguousarray(tensor.dequantize(), np.float32).reshape(tensor.shape[0], -1))
        self.convs.append(w)
        return w

    def load_experts(self, gate, up, down, role: str = "experts") -> moe.CudaExperts:
        # VRAM slots of expert images + pointer tables (cuda_moe); spilled: the tier plan's slot count
        slots = self.tiers.tiers.plan.vram_slots[len(self.experts)] if self.tiers is not None else None
        ex = moe.load_experts(gate, up, down, slots=slots)
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
        # attention's workspace, the rows it is laid out for and the rows its launches take
        self.kv_rows, self.kv_tables, self.table_stride = None, None, 0
        self.attn_ws, self.attn_ws_rows = runner.attn_ws, ops.DECODE_MAX_ROWS
        self.attn_rows = ops.DECODE_MAX_ROWS
        self._values: dict = {}  # id -> (deferred value, its buffer) once launched (_value)
        self._in_h = None  # the deferred rmsnorm whose values buffer "h" holds (_input)

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
            if self._in_h is not v:  # a second consumer of the same norm (an MoE router, then its experts)
                ops.rmsnorm(v.x, v.w, self.eps, h)
                self._in_h = v
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
            self._attn_decode(v, out, qa)
            x = out.reshape(m, H * hd)
            return dict(x=x, prologue="qx", qx_in=qa) if qa is not None else dict(x=x)
        if isinstance(v, _Linear):
            out = self.buf(v.W.role or "linear", v.W.out)
            self._linear(v.x, v.W, out)
            return dict(x=out)
        return dict(x=v)

    def _attn_decode(self, v: _Attention, out, qx_out) -> None:
        """The decode attention of v's rows into out (qx_out: also its outputs' integer-dot codes)."""
        ops.attn_decode(v.q, self.cache_k[v.layer], self.cache_v[v.layer], self.r.kv_type, self.lengths, self.n,
                        v.spec.scale, out, self.attn_ws, self.attn_rows, qx_out=qx_out, act_bf16=self.xb16,
                        tables=self.kv_tables, table_stride=self.table_stride, ws_rows=self.attn_ws_rows)

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

    def _linear(self, x, W: DeviceWeight | PartedWeight, out, epilogue: str = "store", qx_out=None) -> None:
        if isinstance(W, PartedWeight):  # each format's rows into a scratch buffer, then to their columns
            if epilogue not in ("store", "add") or qx_out is not None:
                raise ValueError(f"{W.role}: a matrix in several formats ({W.fmt}) takes no {epilogue} epilogue")
            if not (self.decode and isinstance(x, _Normed)):  # launched once, not once a part
                x = self._value(x)
            lo = 0
            for i, P in enumerate(W.parts):
                part = self.buf(f"{W.role or 'linear'}.{i}", P.out)
                self._linear(x, P, part)
                ops.put_columns(part, out[:, lo:lo + P.out], add=epilogue == "add")
                lo += P.out
            return
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
        self._qk_norm_rope(q, k, v, spec, layer, bias, q_norm, k_norm, q_rot)
        return q_rot

    def _qk_norm_rope(self, q, k, v, spec: AttentionSpec, layer: int, bias, q_norm, k_norm, q_rot, split_ss=None):
        cos, sin = self.r.rope_tables(spec.rope)
        ops.qk_norm_rope_kv_write(q, k, v, q_norm, k_norm, spec.eps, cos, sin, self.positions, spec.rope.style,
                                  spec.rope.rot_dim, self.cache_k[layer], self.cache_v[layer], self.r.kv_type, bias=bias,
                                  q_out=q_rot, qk_norm=spec.qk_norm, q_gated=spec.output_gate, cache_rows=self.kv_rows,
                                  split_ss=split_ss)

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

    def deltanet_split(self, y, spec):
        from .numpy_backend import deltanet_columns

        return deltanet_columns(self._value(y), spec)  # views: the kernels take their rows' strides

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
        return self._experts(x, ids, weights, experts, self._value(residual), shared, add=True)

    def _experts(self, x, ids, weights, experts, out, shared, add: bool):
        """out (+)= the routed experts' weighted sum + the shared expert (add False: out = it, a GPU's
        partial sum of a split model: cuda_sharded.ShardOps.experts)."""
        m, k = ids.shape
        D = out.shape[-1]
        sh = None
        if shared is not None:
            gu_s, down_s, gate_s = shared
            sh = self.buf("moe_shared", D)  # the dense MLP on the dense matvec / GEMM path
            self._linear(_Swiglu(_Linear(x, gu_s)), down_s, sh)
            if gate_s is not None:  # Qwen2-MoE / Qwen3-Next: scaled by sigmoid(x . gate_s), x normed
                ops.shared_gate(sh, self._value(x), gate_s)
        if not self.decode:
            h = self._input(x, matvec=False)["x"]
            run = lambda stream=None: moe.prefill_experts(experts, h, ids, weights, sh, out, m, k,
                                                          act_bf16=self.xb16, add=add)
            if experts.tiers is not None:  # spilled: the streamed experts follow the routing, read on the host
                host_step(run, f"experts of MoE layer {experts.layer}")
            else:  # resident: grouped on the device (moe_group), all launches of the plan
                run()
            return out
        if experts.tiers is not None:  # spilled: the routed experts are copied into VRAM slots first
            host_step(lambda stream: experts.tiers.fetch(experts, ids, m, stream), f"experts of MoE layer {experts.layer}")
        a = self._input(x)
        F = experts.gu.out // 2
        act = self.buf("moe_act", k, F)
        moe.experts_gu(experts, a["x"], ids, act, m, k, norm_w=a.get("norm_w"), eps=self.eps, xb16=self.xb16)
        moe.experts_down(experts, act, ids, weights, sh, out, m, k, xb16=self.xb16, add=add)
        return out

    def lm_head(self, x, W: DeviceWeight):
        if self.decode:
            return self._lm_head_matvec(x, W, self.r.d_logits[:self.n], self.n)
        if not self.all_logits:
            # prefill: only the last row, through the decode path's LM head into logits row 0
            return self._lm_head_matvec(self._last_row(x), W, self.r.d_logits[:1], 1)
        out = kernel_build.device_empty("all_logits", (self.n, W.out), np.float32)
        self._linear(x, W, out)
        return out

    def _last_row(self, x):
        """The pass's last row of x; a deferred norm stays deferred (the LM head's prologue)."""
        return _Normed(x.x[self.n - 1:], x.w) if isinstance(x, _Normed) else self._value(x)[self.n - 1:]

    def _lm_head_matvec(self, x, W: DeviceWeight, out, rows: int):
        """The LM head over ``rows`` rows of x into ``out`` on the decode path's matvec."""
        a = self._input(x, W, matvec=True)
        lin.matvec(W, a.pop("x"), out, rows, act_bf16=self.xb16, **a)
        return out
