"""The CUDA runner: weights resident on the GPU in their quantized form, buffers at fixed
addresses, chunked tensor-core prefill, and a decode step (embedding -> layers -> LM head ->
sampling) that replays as ONE CUDA graph; the host reads back only the sampled token id, through
pinned memory.

Decode step per layer (6 launches; RMSNorm fused into the matvec prologues, SwiGLU and the
residual adds into their epilogues):
    matvec(W_qkv, x, qkv, prologue=rmsnorm(attn_norm))      x: residual (m, D) f32
    qk_norm_rope_kv_write(q, k, v -> cache)                  (+ q/k/v bias, QK-norm, RoPE)
    attn_decode(q, cache -> attn)                            split-K, GQA
    matvec(W_o, attn, x, epilogue=add)
    matvec(W_gu, x, act, prologue=rmsnorm(ffn_norm), epilogue=swiglu [, qx_out=qx_act])
                                   W_gu rows interleaved gate_i, up_i; act: (m, F) = silu(g) * u
    matvec(W_down, act, x, epilogue=add [, prologue=qx over qx_act])
                                   where gate|up's tiles cover whole 32-input blocks (NVFP4 at
                                   m = 1): act's integer-dot codes are written once by gate|up
                                   and copied by down, not re-quantized by each of its blocks
then matvec(W_out, x, logits, prologue=rmsnorm(output_norm)) and the sampler.
The matvec kernels reduce each row in the same order for m = 1..8, so speculative verify and
batched decode reproduce plain decode bit for bit.

Prefill (chunks of ``prefill_chunk`` tokens) runs the GEMMs on tensor cores (bf16 inputs, f32
accumulate) and FlashAttention over the cache; it differs from decode by rounding only
(``bw24chat check`` compares argmax and reports near-ties).

Shape legend: m decode rows (1..8), T prefill tokens, D width, H/K q/kv heads, hd head dim,
F ffn width, V vocabulary, Q = (H + 2K) * hd fused qkv width.
"""
from __future__ import annotations

import os

import numpy as np

from ..api import SamplingParams
from ..models import get_family
from ..rope import build_rope_table
from . import cuda_linear as lin
from . import cuda_ops as ops
from .cuda_weights import repack_host
from .cuda_weights import upload as upload_planes
from .kernel_build import eager_launches

MAX_ROWS = 8
RING = 256  # recent-token ring of the repetition penalty (repeat_last_n is capped to it)

# Host <-> device step image (pinned on the host, mirrored on the device): one H2D copy at the
# start of the graph, one D2H copy of the sampled token at its end.
_IO_TOKEN, _IO_POS, _IO_LEN, _IO_OUT, _IO_PARAMS, _IO_RING = 0, 4, 8, 12, 16, 16 + 8 * ops.SAMPLE_PARAM_WORDS
_IO_BYTES = _IO_RING + 4 * RING


class CudaRunner:
    def __init__(self, checkpoint, n_ctx: int = 0, kv_type: str = "bf16", prefill_chunk: int = 512,
                 use_graph: bool = True, progress=None, precise_prefill: bool = True, activations: str = "f32"):
        import cupy as cp

        self.cp = cp
        fam = get_family(checkpoint.arch)
        a = self.args = fam.ModelArgs.from_dict(checkpoint.config)
        self.n_ctx = min(n_ctx or a.max_position_embeddings, a.max_position_embeddings)
        self.vocab_size = a.vocab_size
        self.kv_type = kv_type
        self.prefill_chunk = prefill_chunk
        self.use_graph = use_graph
        # precise: split-bf16 prefill GEMMs and attention (matches the f32 decode path; the
        # check gates need it); False: plain bf16 tensor-core prefill, ~2-3x faster
        self.precise = precise_prefill
        # the matmul inputs' contract, one for prefill and decode (the decode graph is captured
        # with it): "f32" keeps them exact (the gates: prefill and decode logits ~1e-5 apart);
        # "bf16" rounds every product's input to bf16 first (common.cuh bf16_round), as bf16
        # engines do: one bf16 plane in the prefill GEMMs (pp512 +30-45 %), but the two paths'
        # f32 inputs, ~1e-7 apart, then straddle a bf16 rounding boundary now and then, a whole
        # bf16 step (2^-8) that random check models amplify to ~3e-3 of the logits and a few
        # argmax flips at margins of 1e-3..1e-2 (bench/NOTES.md, twentieth session)
        if activations not in ("bf16", "f32"):
            raise ValueError(f"activations: bf16 or f32, got {activations!r}")
        self.activations = activations
        self.act_bf16 = activations == "bf16"
        t = checkpoint.tensors
        report = progress or (lambda f: None)
        D, H, K, hd = a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim
        F = a.intermediate_size
        self.dims = (D, H, K, hd, F)
        f32 = lambda q: cp.asarray(np.ascontiguousarray(q.dequantize(), np.float32).reshape(-1))  # noqa: E731
        planes = {}

        def upload(tensors, interleave=False):
            # the host repack is memoized on the source arrays: random-weight benchmark models
            # share one set of arrays across layers (each layer still gets its own device copy)
            key = tuple(id(x.raw) for x in tensors) + (interleave,)
            if key not in planes:
                planes[key] = repack_host(tensors, interleave)
            return upload_planes(tensors, planes[key])

        # ---------------------------------------------------------------- weights
        self.w_embed = upload([t["tok_embd"]])
        self.w_out = self.w_embed if (a.tie_word_embeddings or "output" not in t) else upload([t["output"]])
        self.output_norm = f32(t["output_norm"])
        self.layers = []
        for i in range(a.num_hidden_layers):
            p = f"blk.{i}."
            L = {
                "attn_norm": f32(t[p + "attn_norm"]),
                "ffn_norm": f32(t[p + "ffn_norm"]),
                "qkv": upload([t[p + "attn_q"], t[p + "attn_k"], t[p + "attn_v"]]),
                "o": upload([t[p + "attn_o"]]),
                # rows gate_0, up_0, gate_1, up_1, ...: the decode matvec applies SwiGLU in its
                # epilogue, the prefill's swiglu_rows reads the pairs
                "gu": upload([t[p + "ffn_gate"], t[p + "ffn_up"]], interleave=True),
                "down": upload([t[p + "ffn_down"]]),
                "bias": None,
                "q_norm": f32(t[p + "attn_q_norm"]) if p + "attn_q_norm" in t else None,
                "k_norm": f32(t[p + "attn_k_norm"]) if p + "attn_k_norm" in t else None,
            }
            if p + "attn_q_bias" in t:
                L["bias"] = cp.concatenate([f32(t[p + "attn_q_bias"]), f32(t[p + "attn_k_bias"]), f32(t[p + "attn_v_bias"])])
            self.layers.append(L)
            report((i + 1) / a.num_hidden_layers)
        rope = build_rope_table(hd, a.partial_rotary_factor, a.rope_theta, a.rope_scaling, self.n_ctx, a.rope_style, a.max_position_embeddings)
        self.rope_cos, self.rope_sin = cp.asarray(rope.cos), cp.asarray(rope.sin)
        self.rope_style, self.rot_dim = rope.style, rope.rot_dim
        self.attn_scale = 1.0 / float(np.sqrt(hd))

        # ---------------------------------------------------------------- KV cache
        self.cache_k = [ops.kv_cache_alloc(kv_type, self.n_ctx, K, hd) for _ in range(a.num_hidden_layers)]
        self.cache_v = [ops.kv_cache_alloc(kv_type, self.n_ctx, K, hd) for _ in range(a.num_hidden_layers)]

        # ---------------------------------------------------------------- buffers (fixed addresses)
        Q = (H + 2 * K) * hd
        m, T = MAX_ROWS, prefill_chunk
        z = lambda *s: cp.zeros(s, cp.float32)  # noqa: E731
        self.d_x, self.d_qkv, self.d_q, self.d_attn, self.d_act = z(m, D), z(m, Q), z(m, H, hd), z(m, H, hd), z(m, F)
        self.d_logits = z(m, a.vocab_size)
        # the down projection's x codes, written by the gate|up epilogue (matvec.cu qx_out: quantized
        # once per step instead of once per block of the down matvec); F % 32 == 0 where used
        self.d_qx_act = cp.zeros((m, lin.qx_row_words(F - F % 32)), cp.uint32)
        self.d_qx_attn = cp.zeros((m, lin.qx_row_words(H * hd - H * hd % 32)), cp.uint32)
        self.attn_qx = os.environ.get("BW24CHAT_ATTN_QX", "1") != "0" and (H * hd) % 32 == 0  # see _o_takes_qx
        self.attn_ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd, MAX_ROWS), cp.uint8)
        self.sample_ws = cp.zeros(ops.sample_workspace_bytes(a.vocab_size), cp.uint8)
        self.p_x, self.p_h, self.p_qkv = z(T, D), z(T, D), z(T, Q)
        self.p_q, self.p_attn = z(T, H, hd), z(T, H, hd)
        self.p_gu, self.p_act = z(T, 2 * F), z(T, F)
        self.p_ids, self.p_pos = cp.zeros(T, cp.int32), cp.zeros(T, cp.int32)
        # the step image: token, position, keys attended (= position + 1 = the sampled token's
        # position, which keys the Philox draw), sampled token, sampling params, recent ids
        self.h_io = cp.cuda.alloc_pinned_memory(_IO_BYTES)
        self.h_i32 = np.frombuffer(self.h_io, np.int32, _IO_BYTES // 4)
        self.h_params = np.frombuffer(self.h_io, np.uint64, ops.SAMPLE_PARAM_WORDS, _IO_PARAMS)
        self.d_io = cp.zeros(_IO_BYTES, cp.uint8)
        self.d_tokens = self.d_io[_IO_TOKEN:_IO_TOKEN + 4].view(cp.int32)
        self.d_pos = self.d_io[_IO_POS:_IO_POS + 4].view(cp.int32)
        self.d_len = self.d_io[_IO_LEN:_IO_LEN + 4].view(cp.int32)
        self.d_next = self.d_io[_IO_OUT:_IO_OUT + 4].view(cp.int32)
        self.d_params = self.d_io[_IO_PARAMS:_IO_RING].view(cp.uint64)
        self.d_ring = self.d_io[_IO_RING:].view(cp.int32)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graph = None

    # ==================================================================== prefill
    def _prefill_chunk(self, ids: np.ndarray, start: int, all_logits: bool):
        with eager_launches():  # host-launched: CuPy's cheaper launch path (kernel_build)
            return self._prefill_chunk_body(ids, start, all_logits)

    def _prefill_chunk_body(self, ids: np.ndarray, start: int, all_logits: bool):
        cp = self.cp
        a = self.args
        T = len(ids)
        D, H, K, hd, F = self.dims
        eps = a.rms_norm_eps
        self.p_ids[:T].set(np.asarray(ids, np.int32), stream=self.stream)
        self.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32), stream=self.stream)
        x, h, qkv, q_rot, attn = self.p_x[:T], self.p_h[:T], self.p_qkv[:T], self.p_q[:T], self.p_attn[:T]
        gu, act = self.p_gu[:T], self.p_act[:T]
        lin.embed(self.w_embed, self.p_ids[:T], x)
        for li, L in enumerate(self.layers):
            ops.rmsnorm(x, L["attn_norm"], eps, h)
            pr = self.precise
            lin.gemm(L["qkv"], h, qkv, T, precise=pr, act_bf16=self.act_bf16)
            self._rope_kv(qkv, q_rot, L, self.p_pos[:T], li, T)
            ops.attn_prefill(q_rot, self.cache_k[li], self.cache_v[li], self.kv_type, start, T, self.attn_scale, attn, precise=pr)
            lin.gemm(L["o"], attn.reshape(T, H * hd), x, T, epilogue="add", precise=pr, act_bf16=self.act_bf16)
            ops.rmsnorm(x, L["ffn_norm"], eps, h)
            lin.gemm(L["gu"], h, gu, T, precise=pr, act_bf16=self.act_bf16)
            ops.swiglu(gu, act)
            lin.gemm(L["down"], act, x, T, epilogue="add", precise=pr, act_bf16=self.act_bf16)
        if all_logits:
            out = cp.empty((T, a.vocab_size), cp.float32)
            ops.rmsnorm(x, self.output_norm, eps, h)
            lin.gemm(self.w_out, h, out, T, precise=self.precise, act_bf16=self.act_bf16)
            return out
        # the last row through the decode path's LM head (rmsnorm fused) into logits row 0
        lin.matvec(self.w_out, x[T - 1:T], self.d_logits[:1], 1, prologue="rmsnorm", norm_w=self.output_norm, eps=eps,
                   act_bf16=self.act_bf16)
        return self.d_logits[0]

    def _rope_kv(self, qkv, q_rot, L, positions, li, T):
        D, H, K, hd, F = self.dims
        q = qkv[:, : H * hd].reshape(T, H, hd)  # (T, H, hd) column slices of the fused output
        k = qkv[:, H * hd:(H + K) * hd].reshape(T, K, hd)
        v = qkv[:, (H + K) * hd:].reshape(T, K, hd)
        ops.qk_norm_rope_kv_write(q, k, v, L["q_norm"], L["k_norm"], self.args.rms_norm_eps, self.rope_cos, self.rope_sin,
                                  positions, self.rope_style, self.rot_dim, self.cache_k[li], self.cache_v[li], self.kv_type,
                                  bias=L["bias"], q_out=q_rot)

    def prefill(self, ids: np.ndarray, start: int):
        """Run ids at positions start..; the device logits of the last position (d_logits[0])."""
        with self.stream:
            logits = None
            for s in range(0, len(ids), self.prefill_chunk):
                logits = self._prefill_chunk(ids[s: s + self.prefill_chunk], start + s, False)
        return logits

    def prefill_all(self, ids: np.ndarray, start: int, chunk: int | None = None):
        """Logits at every position (T, V) on the device (checks: chunk invariance, argmax)."""
        chunk = chunk or self.prefill_chunk
        if chunk > self.prefill_chunk:
            raise ValueError(f"chunk {chunk} > the buffers' {self.prefill_chunk}")
        with self.stream:
            outs = [self._prefill_chunk(ids[s: s + chunk], start + s, True) for s in range(0, len(ids), chunk)]
            out = self.cp.concatenate(outs)
        # the runner works on its own non-blocking stream: a caller reading `out` on another
        # stream (cp.asnumpy uses the current one) must not race the kernels still running
        self.stream.synchronize()
        return out

    # ==================================================================== decode step
    def _decode_body(self, m: int):
        """The kernels of one decode step for m rows (tokens, positions and lengths already in
        d_io).  Captured into the graph, or run eagerly: the same launches either way."""
        a = self.args
        D, H, K, hd, F = self.dims
        eps = a.rms_norm_eps
        x, qkv, q_rot, attn, act = self.d_x[:m], self.d_qkv[:m], self.d_q[:m], self.d_attn[:m], self.d_act[:m]
        lin.embed(self.w_embed, self.d_tokens[:m], x)
        for li, L in enumerate(self.layers):
            lin.matvec(L["qkv"], x, qkv, m, prologue="rmsnorm", norm_w=L["attn_norm"], eps=eps, act_bf16=self.act_bf16)
            self._rope_kv(qkv, q_rot, L, self.d_pos[:m], li, m)
            qa = self.d_qx_attn[:m] if self._o_takes_qx(L, m) else None
            ops.attn_decode(q_rot, self.cache_k[li], self.cache_v[li], self.kv_type, self.d_len[:m], m, self.attn_scale, attn,
                            self.attn_ws, qx_out=qa, act_bf16=self.act_bf16)
            if qa is None:
                lin.matvec(L["o"], attn.reshape(m, H * hd), x, m, epilogue="add", act_bf16=self.act_bf16)
            else:  # x's codes from the attention's finishing blocks: the same bits as quantizing attn here
                lin.matvec(L["o"], attn.reshape(m, H * hd), x, m, prologue="qx", epilogue="add", qx_in=qa,
                           act_bf16=self.act_bf16)
            qx = self.d_qx_act[:m] if self._down_takes_qx(L, m) else None
            lin.matvec(L["gu"], x, act, m, prologue="rmsnorm", epilogue="swiglu", norm_w=L["ffn_norm"], eps=eps, qx_out=qx,
                       act_bf16=self.act_bf16)
            if qx is None:
                lin.matvec(L["down"], act, x, m, epilogue="add", act_bf16=self.act_bf16)
            else:  # x's codes from gate|up's epilogue: the same bits as quantizing act here
                lin.matvec(L["down"], act, x, m, prologue="qx", epilogue="add", qx_in=qx, act_bf16=self.act_bf16)
        lin.matvec(self.w_out, x, self.d_logits[:m], m, prologue="rmsnorm", norm_w=self.output_norm, eps=eps,
                   act_bf16=self.act_bf16)

    def _o_takes_qx(self, L, m: int) -> bool:
        """The decode attention writes the o projection's x codes (attention.cu ATTN_QX) and o
        reads them (prologue "qx") where o is on the integer-dot contract: the same bits, o's
        prologue a copy.  Measured (H100, twenty-first session, bench --decode-only, off / on, two
        rounds): NVFP4 tg128@512 430.5 / 438.1, 430.9 / 436.0, @8192 322.0 / 334.6, 323.0 / 334.5;
        Q8_0 295.9 / 299.2, 296.1 / 299.1, 242.4 / 248.8.  BW24CHAT_ATTN_QX=0 turns it off."""
        return self.attn_qx and lin.takes_qx(L["o"], m)

    @staticmethod
    def _down_takes_qx(L, m: int) -> bool:
        """gate|up writes the down projection's x codes (lin.writes_qx) and down is on the
        integer-dot contract (any quantized format: the QX buffer does not depend on it)."""
        return lin.writes_qx(L["gu"], m) and lin.takes_qx(L["down"], m)

    def _h2d_io(self):
        rt = self.cp.cuda.runtime
        # a raw runtime copy: CuPy refuses H2D copies while capturing; CUDA allows them from pinned memory
        rt.memcpyAsync(self.d_io.data.ptr, self.h_io.ptr, _IO_BYTES, rt.memcpyHostToDevice, self.stream.ptr)

    def _d2h_token(self):
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(self.h_io.ptr + _IO_OUT, self.d_io.data.ptr + _IO_OUT, 4, rt.memcpyDeviceToHost, self.stream.ptr)

    def _step_body(self):
        """One decode step: H2D step image -> decode -> sample -> D2H sampled token."""
        self._h2d_io()
        self._decode_body(1)
        ops.sample(self.d_logits[0], self.d_params, self.d_next, self.d_ring, self.d_len, self.sample_ws)
        self._d2h_token()

    def _capture(self):
        with self.stream:
            self.stream.begin_capture()
            try:
                self._step_body()
            finally:
                self.graph = self.stream.end_capture()

    def _write_io(self, token: int, pos: int, params: SamplingParams, seed: int, history: list[int]):
        n = min(len(history), params.repeat_last_n, RING) if params.repeat_penalty != 1.0 else 0
        self.h_i32[_IO_TOKEN // 4] = token
        self.h_i32[_IO_POS // 4] = pos
        self.h_i32[_IO_LEN // 4] = pos + 1
        self.h_params[:] = ops.pack_sampling_params(params, seed, n)
        if n:
            self.h_i32[_IO_RING // 4:_IO_RING // 4 + n] = history[-n:]

    def decode(self, token: int, pos: int):
        """Record the pending step; the work runs in sample() (decode and sampling are one graph)."""
        self._pending = (int(token), int(pos))
        return self

    def sample(self, logits, params: SamplingParams, seed: int, pos: int, history: list[int]) -> int:
        if logits is self:  # a decode step: token at pos -> graph -> the token at pos + 1
            tok, p = self._pending
            self._write_io(tok, p, params, seed, history)
            if self.use_graph:
                if self.graph is None:
                    self._capture()
                self.graph.launch(self.stream)
            else:
                with self.stream:
                    self._step_body()
        else:  # the first token after prefill: its logits are already in d_logits[0]
            self._write_io(0, pos - 1, params, seed, history)
            with self.stream:
                self._h2d_io()
                ops.sample(self.d_logits[0], self.d_params, self.d_next, self.d_ring, self.d_len, self.sample_ws)
                self._d2h_token()
        self.stream.synchronize()
        return int(self.h_i32[_IO_OUT // 4])

    def decode_logits(self, token: int, pos: int) -> np.ndarray:
        """One decode step (graph or eager, as configured); host copy of its logits (checks)."""
        self.sample(self.decode(token, pos), SamplingParams(temperature=0), 0, pos + 1, [])
        return self.logits_host()

    def host_logits(self, logits) -> np.ndarray:
        """Host copy of the logits the last prefill or decode step left (for logprobs)."""
        return self.logits_host()

    def logits_host(self) -> np.ndarray:
        self.stream.synchronize()
        return self.cp.asnumpy(self.d_logits[0])

    def warmup(self) -> None:
        """Compile every kernel the runner uses (NVRTC, cached on disk after the first start) and
        capture the decode graph, so the first request pays neither.  Positions 0..2 of the cache
        are overwritten later like any other."""
        self.prefill(np.array([0, 1], np.int64), 0)
        self.sample(self.d_logits[0], SamplingParams(temperature=0), 0, 2, [])
        self.sample(self.decode(0, 2), SamplingParams(temperature=0), 0, 3, [])

    def memory_info(self) -> dict:
        free, total = self.cp.cuda.runtime.memGetInfo()
        return {"vram_used": total - free, "vram_total": total}


KV_BYTES_PER_VALUE = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0, "f32": 4.0}
# activation buffers, workspaces, prefill scratch (the wgmma GEMM's dequantized weight planes
# included), CUDA context slack
RESERVE_BYTES = (3 << 29) + lin.WGP_SCRATCH_BYTES


def fit_context(max_ctx: int, requested: int, budget_bytes: int, weight_bytes: int, n_layers: int, n_kv: int,
                head_dim: int, kv_type: str) -> int:
    """The context the KV cache can hold: the request (or the model's maximum) capped by what is
    left of the VRAM budget after the weights and a reserve, in multiples of 256 (at least 256)."""
    want = min(requested or max_ctx, max_ctx)
    per_token = 2 * n_layers * n_kv * (head_dim * KV_BYTES_PER_VALUE[kv_type] + (4 if kv_type == "fp8" else 0))
    fits = int((budget_bytes - weight_bytes - RESERVE_BYTES) // per_token)
    return max(256, min(want, fits) // 256 * 256) if fits < want else want


def make_cuda_runner(checkpoint, options, report):
    import cupy as cp

    from ..api import LoadProgress
    from ..models import get_family

    a = get_family(checkpoint.arch).ModelArgs.from_dict(checkpoint.config)
    free, _total = cp.cuda.runtime.memGetInfo()
    budget = int(options.vram_budget_gb * 2**30) if options.vram_budget_gb else free
    n_ctx = fit_context(a.max_position_embeddings, options.n_ctx, budget, checkpoint.nbytes, a.num_hidden_layers,
                        a.num_key_value_heads, a.head_dim, options.kv_cache)
    if n_ctx < min(options.n_ctx or a.max_position_embeddings, a.max_position_embeddings):
        report(LoadProgress("uploading", 0.0, f"context capped at {n_ctx} tokens to fit the VRAM budget"))
    runner = CudaRunner(checkpoint, n_ctx, options.kv_cache, progress=lambda f: report(LoadProgress("uploading", f)),
                        activations=options.activations)
    report(LoadProgress("compiling", 0.0, "compiling kernels (cached after the first start) and capturing the decode graph"))
    runner.warmup()
    report(LoadProgress("compiling", 1.0))
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    return runner, name
