"""The CUDA runner: weights resident on the GPU in their quantized form, buffers at fixed
addresses, chunked tensor-core prefill, and a decode step (embedding -> layers -> LM head ->
sampling) that replays as ONE CUDA graph; the host reads back only the sampled token id, through
pinned memory.

Decode step per layer (6 launches; RMSNorm and SwiGLU fused into the matvec prologues, the
residual adds into their epilogues):
    matvec(W_qkv, x, qkv, prologue=rmsnorm(attn_norm))      x: residual (m, D) f32
    qk_norm_rope_kv_write(q, k, v -> cache)                  (+ q/k/v bias, QK-norm, RoPE)
    attn_decode(q, cache -> attn)                            split-K, GQA
    matvec(W_o, attn, x, epilogue=add)
    matvec(W_gu, x, gu, prologue=rmsnorm(ffn_norm))          gu: (m, 2F) = gate | up
    matvec(W_down, gu, x, prologue=swiglu, epilogue=add)
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

import numpy as np

from ..api import SamplingParams
from ..models import get_family
from ..rope import build_rope_table
from . import cuda_linear as lin
from . import cuda_ops as ops
from .cuda_weights import upload

MAX_ROWS = 8


class CudaRunner:
    def __init__(self, checkpoint, n_ctx: int = 0, kv_type: str = "bf16", prefill_chunk: int = 512,
                 use_graph: bool = True, progress=None):
        import cupy as cp

        self.cp = cp
        fam = get_family(checkpoint.arch)
        a = self.args = fam.ModelArgs.from_dict(checkpoint.config)
        self.n_ctx = min(n_ctx or a.max_position_embeddings, a.max_position_embeddings)
        self.vocab_size = a.vocab_size
        self.kv_type = kv_type
        self.prefill_chunk = prefill_chunk
        self.use_graph = use_graph
        t = checkpoint.tensors
        report = progress or (lambda f: None)
        D, H, K, hd = a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.dims = (D, H, K, hd, a.intermediate_size)
        f32 = lambda q: cp.asarray(np.ascontiguousarray(q.dequantize(), np.float32).reshape(-1))  # noqa: E731

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
                "gu": upload([t[p + "ffn_gate"], t[p + "ffn_up"]]),
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
        self.cache_k, self.cache_v = [], []
        for _ in range(a.num_hidden_layers):
            ck, cv = ops.new_kv_cache(self.n_ctx, K, hd, kv_type)
            self.cache_k.append(ck)
            self.cache_v.append(cv)

        # ---------------------------------------------------------------- buffers (fixed addresses)
        Q = (H + 2 * K) * hd
        F = a.intermediate_size
        m, T = MAX_ROWS, prefill_chunk
        z = lambda *s: cp.zeros(s, cp.float32)  # noqa: E731
        self.d_x, self.d_qkv, self.d_attn, self.d_gu = z(m, D), z(m, Q), z(m, H * hd), z(m, 2 * F)
        self.d_logits = z(m, a.vocab_size)
        self.d_tokens = cp.zeros(m, cp.int32)
        self.d_pos = cp.zeros(m, cp.int32)  # position of each decode row
        self.d_len = cp.zeros(m, cp.int32)  # keys each row attends (pos + 1)
        self.d_next = cp.zeros(m, cp.int32)  # sampled ids
        self.attn_ws = cp.zeros(ops.attn_decode_workspace_bytes(MAX_ROWS, H, hd, self.n_ctx) // 4 + 1, cp.float32)
        self.p_x, self.p_h, self.p_qkv, self.p_attn = z(T, D), z(T, D), z(T, Q), z(T, H * hd)
        self.p_gu, self.p_act = z(T, 2 * F), z(T, F)
        self.p_ids, self.p_pos = cp.zeros(T, cp.int32), cp.zeros(T, cp.int32)
        self.sampler = ops.DeviceSampler(a.vocab_size, self.d_logits[0], self.d_next[:1])
        self.h_io = cp.cuda.alloc_pinned_memory(16)  # token in, position in, token out
        self.h_view = np.frombuffer(self.h_io, np.int32, 4)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graph = None
        self.graph_m = 0

    # ==================================================================== prefill
    def _prefill_chunk(self, ids: np.ndarray, start: int, all_logits: bool):
        cp = self.cp
        a = self.args
        T = len(ids)
        D, H, K, hd, F = self.dims
        eps = a.rms_norm_eps
        self.p_ids[:T].set(np.asarray(ids, np.int32))
        self.p_pos[:T].set(np.arange(start, start + T, dtype=np.int32))
        x, h, qkv, attn, gu, act = self.p_x[:T], self.p_h[:T], self.p_qkv[:T], self.p_attn[:T], self.p_gu[:T], self.p_act[:T]
        lin.embed(self.w_embed, self.p_ids[:T], x)
        for li, L in enumerate(self.layers):
            ops.rmsnorm(x, L["attn_norm"], eps, h)
            lin.gemm(L["qkv"], h, qkv, T)
            q, k, v = qkv[:, : H * hd], qkv[:, H * hd : (H + K) * hd], qkv[:, (H + K) * hd :]
            ops.qk_norm_rope_kv_write(q, k, v, L["bias"], L["q_norm"], L["k_norm"], eps, self.rope_cos, self.rope_sin,
                                      self.p_pos[:T], self.rope_style, self.rot_dim, self.cache_k[li], self.cache_v[li], self.kv_type)
            ops.attn_prefill(q, self.cache_k[li], self.cache_v[li], self.kv_type, start, T, self.attn_scale, attn, H, K, hd)
            lin.gemm(L["o"], attn, x, T, epilogue="add")
            ops.rmsnorm(x, L["ffn_norm"], eps, h)
            lin.gemm(L["gu"], h, gu, T)
            ops.swiglu(gu, act)
            lin.gemm(L["down"], act, x, T, epilogue="add")
        if all_logits:
            out = cp.empty((T, a.vocab_size), cp.float32)
            ops.rmsnorm(x, self.output_norm, eps, h)
            lin.gemm(self.w_out, h, out, T)
            return out
        # last row only: the decode-path LM head (rmsnorm fused) into logits row 0
        self.d_x[0] = x[T - 1]
        lin.matvec(self.w_out, self.d_x[:1], self.d_logits[:1], 1, prologue=("rmsnorm", self.output_norm, eps))
        return self.d_logits[0]

    def prefill(self, ids: np.ndarray, start: int):
        """Run ids at positions start..; returns the device logits of the last position."""
        with self.stream:
            logits = None
            for s in range(0, len(ids), self.prefill_chunk):
                logits = self._prefill_chunk(ids[s : s + self.prefill_chunk], start + s, False)
        return logits

    def prefill_all(self, ids: np.ndarray, start: int, chunk: int | None = None):
        """Logits at every position (T, V) on the device (checks: chunk invariance, argmax)."""
        chunk = chunk or self.prefill_chunk
        outs = []
        with self.stream:
            for s in range(0, len(ids), chunk):
                outs.append(self._prefill_chunk(ids[s : s + chunk], start + s, True))
        return self.cp.concatenate(outs)

    # ==================================================================== decode step
    def _decode_body(self, m: int):
        """The kernels of one decode step for m rows (tokens and positions already in
        d_tokens/d_pos/d_len on the device).  Captured into the graph, or run eagerly."""
        a = self.args
        D, H, K, hd, F = self.dims
        eps = a.rms_norm_eps
        x, qkv, attn, gu = self.d_x[:m], self.d_qkv[:m], self.d_attn[:m], self.d_gu[:m]
        lin.embed(self.w_embed, self.d_tokens[:m], x)
        for li, L in enumerate(self.layers):
            lin.matvec(L["qkv"], x, qkv, m, prologue=("rmsnorm", L["attn_norm"], eps))
            q, k, v = qkv[:, : H * hd], qkv[:, H * hd : (H + K) * hd], qkv[:, (H + K) * hd :]
            ops.qk_norm_rope_kv_write(q, k, v, L["bias"], L["q_norm"], L["k_norm"], eps, self.rope_cos, self.rope_sin,
                                      self.d_pos[:m], self.rope_style, self.rot_dim, self.cache_k[li], self.cache_v[li], self.kv_type)
            ops.attn_decode(q, self.cache_k[li], self.cache_v[li], self.kv_type, self.d_len[:m], m, self.attn_scale, attn, self.attn_ws, H, K, hd)
            lin.matvec(L["o"], attn, x, m, epilogue="add")
            lin.matvec(L["gu"], x, gu, m, prologue=("rmsnorm", L["ffn_norm"], eps))
            lin.matvec(L["down"], gu, x, m, prologue="swiglu", epilogue="add")
        lin.matvec(self.w_out, x, self.d_logits[:m], m, prologue=("rmsnorm", self.output_norm, eps))

    def _step_body(self):
        """One graph: H2D (token, pos) from pinned memory -> decode -> sample -> D2H token."""
        cp = self.cp
        # raw runtime copies: CuPy refuses H2D copies while capturing, CUDA allows them from pinned memory
        rt = cp.cuda.runtime
        rt.memcpyAsync(self.d_tokens.data.ptr, self.h_io.ptr, 4, rt.memcpyHostToDevice, self.stream.ptr)
        rt.memcpyAsync(self.d_pos.data.ptr, self.h_io.ptr + 4, 4, rt.memcpyHostToDevice, self.stream.ptr)
        ops.positions_to_lengths(self.d_pos[:1], self.d_len[:1])
        self._decode_body(1)
        self.sampler.sample(self.d_pos[:1], self.d_tokens[:1])
        rt.memcpyAsync(self.h_io.ptr + 8, self.d_next.data.ptr, 4, rt.memcpyDeviceToHost, self.stream.ptr)

    def _capture(self):
        with self.stream:
            self.stream.begin_capture()
            try:
                self._step_body()
            finally:
                self.graph = self.stream.end_capture()

    def decode(self, token: int, pos: int):
        """Record the pending step; the work runs in sample() (decode and sampling are one graph)."""
        self._pending = (int(token), int(pos))
        return self

    def sample(self, logits, params: SamplingParams, seed: int, pos: int, history: list[int]) -> int:
        self.sampler.set_params(params, seed, history)
        if logits is self:  # a decode step: token/pos -> graph -> next token
            tok, p = self._pending
            self.h_view[0], self.h_view[1] = tok, p
            if self.use_graph:
                if self.graph is None:
                    self._capture()
                self.graph.launch(self.stream)
            else:
                with self.stream:
                    self._step_body()
            self.stream.synchronize()
            return int(self.h_view[2])
        # first token after prefill: the logits are already in d_logits[0]
        with self.stream:
            self.d_pos[:1].set(np.array([pos], np.int32))
            self.sampler.sample(self.d_pos[:1], None)
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(self.h_io.ptr + 8, self.d_next.data.ptr, 4, rt.memcpyDeviceToHost, self.stream.ptr)
        self.stream.synchronize()
        return int(self.h_view[2])

    def decode_logits(self, token: int, pos: int) -> np.ndarray:
        """One decode step (graph or eager, as configured); host copy of its logits (checks)."""
        self.sample(self.decode(token, pos), SamplingParams(temperature=0), 0, pos + 1, [])
        return self.logits_host()

    def logits_host(self) -> np.ndarray:
        self.stream.synchronize()
        return self.cp.asnumpy(self.d_logits[0])

    def memory_info(self) -> dict:
        free, total = self.cp.cuda.runtime.memGetInfo()
        return {"vram_used": total - free, "vram_total": total}


def make_cuda_runner(checkpoint, options, report):
    import cupy as cp

    from ..api import LoadProgress

    runner = CudaRunner(checkpoint, options.n_ctx, options.kv_cache,
                        progress=lambda f: report(LoadProgress("uploading", f)))
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    return runner, name
