"""The kernel section of ``bw24chat check``: every CUDA kernel family against its NumPy
reference on fresh random inputs (odd sizes included), with the limits of the issue:
dequantization 0 bit mismatches; matvec / GEMM with f32 accumulation vs float64: relative error
<= 1e-3 (prefill GEMM: <= 1e-4); attention <= 2e-3; RoPE bit-exact; the gated DeltaNet's
recurrence <= 1e-4 with a pass's rows bit-equal to one-row launches; the MoE decode experts <= 1e-4
against NumpyOps.experts with an m-row launch's rows bit-equal to one-row launches; the expert images
repacked on the GPU byte for byte the host's; device sampling picks the
NumPy sampler's token.  The GPU pytest suite (tests/gpu) covers the same ground in more
cases; this module is what a user runs on their own GPU.

Each check returns (name, measured, limit, ok).
"""
from __future__ import annotations

import math

import numpy as np

from .api import SamplingParams
from .loaders.tensor import QTensor
from .synthetic import random_matrix

FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "NVFP4", "MXFP4", "Q2_K",
           "Q3_K"]


def _rel(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def _weight(fmt: str, rows: int, cols: int, rng) -> QTensor:
    if fmt == "F32":
        return QTensor("w", "F32", (rows, cols), (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32))
    return random_matrix(fmt, rows, cols, rng)


def check_linear(cp, rng) -> list[tuple]:
    from .backends import cuda_linear as lin, tuning
    from .backends.cuda_weights import upload
    from .backends.kernel_refs import FLOAT_FORMATS, act_q8, act_quant_ref, bf16_round

    out = []
    for fmt in FORMATS:
        cols = 256 * int(rng.integers(2, 5))  # a multiple of every block size
        rows = int(rng.integers(97, 300))  # odd row counts
        t = _weight(fmt, rows, cols, rng)
        W = upload([t])
        ref_w = t.dequantize()
        # dequantize: bit for bit
        d = cp.full((rows, cols), np.nan, cp.float32)
        lin.dequantize(W, d)
        bad = int(np.count_nonzero(cp.asnumpy(d).view(np.uint32) != ref_w.view(np.uint32)))
        out.append((f"dequantize {fmt}", f"{bad} bit mismatches", "0", bad == 0))
        # the default contract; the opt-in integer-dot one (quantized formats); the opt-in
        # bf16-activation contract (--activations bf16: decode act_quant(bf16(x)) or bf16(x),
        # prefill bf16(x) as its one plane)
        modes = [(act_q8(fmt), False)] + ([(True, False)] if fmt not in FLOAT_FORMATS and not act_q8(fmt) else [])
        for a8, xb16 in modes + [(act_q8(fmt), True)]:
            tag = " bf16-x" if xb16 else " int8-x" if a8 else ""
            # matvec m = 1..8: f32 accumulation vs float64, and each row bit-equal to its m=1 result
            x = rng.standard_normal((8, cols)).astype(np.float32)
            xin = bf16_round(x) if xb16 else x
            xin = act_quant_ref(xin) if a8 else xin  # the integer-dot contract quantizes x first
            ref = xin.astype(np.float64) @ ref_w.astype(np.float64).T
            y8 = cp.full((8, rows), np.nan, cp.float32)
            lin.matvec(W, cp.asarray(x), y8, 8, act_quant=a8, act_bf16=xb16)
            y8 = cp.asnumpy(y8)
            rows_equal = True
            for r in range(8):
                y1 = cp.full((1, rows), np.nan, cp.float32)
                lin.matvec(W, cp.asarray(x[r:r + 1]), y1, 1, act_quant=a8, act_bf16=xb16)
                rows_equal &= bool(np.array_equal(cp.asnumpy(y1).view(np.uint32), y8[r:r + 1].view(np.uint32)))
            err = _rel(y8, ref)
            out.append((f"matvec {fmt}{tag} m=1..8", f"rel {err:.1e}, rows {'bit-equal' if rows_equal else 'DIFFER'}", "1e-3, equal",
                        err <= 1e-3 and rows_equal))
            # prefill GEMM, T not a multiple of the tile: x split (or quantized, exact in bf16;
            # under bf16-x the rounded x as one plane) and W split where not bf16-exact ->
            # compare with the exact weights
            T = int(rng.integers(100, 300))
            xg = rng.standard_normal((T, cols)).astype(np.float32)
            g = cp.full((T, rows), np.nan, cp.float32)
            lin.gemm(W, cp.asarray(xg), g, T, act_quant=a8, act_bf16=xb16)
            xgin = bf16_round(xg) if xb16 else act_quant_ref(xg) if a8 else xg
            err = _rel(cp.asnumpy(g), xgin.astype(np.float64) @ ref_w.astype(np.float64).T)
            out.append((f"gemm {fmt}{tag} T={T}", f"rel {err:.1e}", "1e-4", err <= 1e-4))
    # NVFP4 / Q4_K / Q8_0 matrices of >= GEMM_WIDE_ROWS rows take gemm_wra on sm_90a (the codes
    # decoded into wgmma's register operand): one such shape each, odd rows and T
    for fmt in lin.WRA_FORMATS:
        rows, cols, T = tuning.GEMM_WIDE_ROWS + int(rng.integers(1, 100)), 512, int(rng.integers(100, 300))
        t = _weight(fmt, rows, cols, rng)
        W = upload([t])
        xg = rng.standard_normal((T, cols)).astype(np.float32)
        g = cp.full((T, rows), np.nan, cp.float32)
        lin.gemm(W, cp.asarray(xg), g, T)
        err = _rel(cp.asnumpy(g), act_quant_ref(xg).astype(np.float64) @ t.dequantize().astype(np.float64).T)
        out.append((f"gemm {fmt} {rows} rows T={T}", f"rel {err:.1e}", "1e-4", err <= 1e-4))
        lin.gemm(W, cp.asarray(xg), g, T, act_bf16=True)
        err = _rel(cp.asnumpy(g), bf16_round(xg).astype(np.float64) @ t.dequantize().astype(np.float64).T)
        out.append((f"gemm {fmt} bf16-x {rows} rows T={T}", f"rel {err:.1e}", "1e-4", err <= 1e-4))
    # put_columns (one format's share of a fused output in several formats), copy and add: bit for bit
    from .backends import cuda_ops

    T, n, ld, lo = int(rng.integers(1, 40)), int(rng.integers(1, 700)), 1500, int(rng.integers(0, 700))
    src, base = (rng.standard_normal(s).astype(np.float32) for s in ((T, n), (T, ld)))
    bad = 0
    for add in (False, True):
        d = cp.asarray(base)
        cuda_ops.put_columns(cp.asarray(src), d[:, lo:lo + n], add=add)
        want = base.copy()
        want[:, lo:lo + n] = base[:, lo:lo + n] + src if add else src
        bad += int(np.count_nonzero(cp.asnumpy(d).view(np.uint32) != want.view(np.uint32)))
    out.append((f"put_columns T={T} n={n}", f"{bad} bit mismatches", "0", bad == 0))
    return out


def check_norm_rope(cp, rng) -> list[tuple]:
    from .backends import cuda_ops as ops
    from .backends.numpy_backend import rmsnorm_ref
    from .rope import apply_rope, build_rope_table

    out = []
    T, D = 7, 4096 + 64
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    y = cp.full((T, D), np.nan, cp.float32)
    ops.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-6, y)
    err = _rel(cp.asnumpy(y), rmsnorm_ref(x.astype(np.float64), w, 1e-6))
    out.append(("rmsnorm", f"rel {err:.1e}", "1e-6", err <= 1e-6))
    for style in ("neox", "normal"):
        H, K, hd = 8, 2, 128
        tab = build_rope_table(hd, 1.0, 1e6, None, 4096, style, 4096)
        q = rng.standard_normal((T, H, hd)).astype(np.float32)
        k = rng.standard_normal((T, K, hd)).astype(np.float32)
        v = rng.standard_normal((T, K, hd)).astype(np.float32)
        pos = rng.integers(0, 4096, T).astype(np.int32)
        qd, kd, vd = cp.asarray(q), cp.asarray(k), cp.asarray(v)
        ops.qk_norm_rope_kv_write(qd, kd, vd, None, None, 1e-6, cp.asarray(tab.cos), cp.asarray(tab.sin), cp.asarray(pos),
                                  style, tab.rot_dim, None, None, None)
        bad = int(np.count_nonzero(cp.asnumpy(qd).view(np.uint32) != apply_rope(q, pos, tab).view(np.uint32)))
        bad += int(np.count_nonzero(cp.asnumpy(kd).view(np.uint32) != apply_rope(k, pos, tab).view(np.uint32)))
        out.append((f"rope {style}", f"{bad} bit mismatches", "0", bad == 0))
    out.append(check_full_qk_norm(cp, rng))
    return out


def check_full_qk_norm(cp, rng) -> tuple:
    """rope.cu's QK-norm over the whole q and k projections (MiniMax-M2: H 48, K 8, hd 128, 64
    rotary dims) with RoPE: bit-equal to kernel_refs.qk_norm_ref + rope.apply_rope, and each row
    the same computed alone (a decode step) as in a chunk of 13 (prefill)."""
    from .backends import cuda_ops as ops
    from .backends.kernel_refs import qk_norm_ref
    from .rope import apply_rope, build_rope_table

    T, H, K, hd = 13, 48, 8, 128
    tab = build_rope_table(hd, 0.5, 5e6, None, 4096, "neox", 4096)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    qkv = (rng.standard_normal((T, (H + 2 * K) * hd)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    qw, kw = (rng.uniform(0.5, 1.5, n * hd).astype(np.float32) for n in (H, K))
    cos, sin, dqw, dkw = (cp.asarray(a) for a in (tab.cos, tab.sin, qw, kw))

    def run(rows):
        d = cp.asarray(qkv[rows])
        n = len(d)
        q, k, v = (d[:, a * hd:b * hd].reshape(n, b - a, hd) for a, b in ((0, H), (H, H + K), (H + K, H + 2 * K)))
        ops.qk_norm_rope_kv_write(q, k, v, dqw, dkw, 1e-6, cos, sin, cp.asarray(pos[rows]), "neox", tab.rot_dim,
                                  None, None, None, qk_norm="full")
        return cp.asnumpy(q), cp.asnumpy(k)

    q, k = run(slice(0, T))
    want_q = apply_rope(qk_norm_ref(qkv[:, :H * hd].reshape(T, H, hd), qw, 1e-6, True), pos, tab)
    want_k = apply_rope(qk_norm_ref(qkv[:, H * hd:(H + K) * hd].reshape(T, K, hd), kw, 1e-6, True), pos, tab)
    bad = int(np.count_nonzero(q.view(np.uint32) != want_q.view(np.uint32)))
    bad += int(np.count_nonzero(k.view(np.uint32) != want_k.view(np.uint32)))
    alone = [run(slice(t, t + 1)) for t in (0, 6, T - 1)]
    same = all(np.array_equal(a[0][0].view(np.uint32), q[t].view(np.uint32)) and
               np.array_equal(a[1][0].view(np.uint32), k[t].view(np.uint32)) for a, t in zip(alone, (0, 6, T - 1)))
    return ("qk-norm full width + rope", f"{bad} bit mismatches, rows {'bit-equal' if same else 'DIFFER'} alone",
            "0, equal", bad == 0 and same)


def check_attention(cp, rng) -> list[tuple]:
    from .backends import cuda_ops as ops
    from .backends import kernel_refs as kr

    out = []
    for kv_type in ("bf16", "q8_0", "fp8"):
        H, K, hd = 32, 8, 128
        N = 1500
        caches = []
        for _ in range(2):
            x = rng.standard_normal((N, K, hd)).astype(np.float32)
            buf = kr.kv_cache_pack(*kr.kv_quantize(x, kv_type), kv_type)
            caches.append((cp.asarray(buf), kr.kv_cache_values(buf, kv_type, N, K, hd)))
        (ck, kv), (cv, vv) = caches
        scale = 1.0 / math.sqrt(hd)
        lengths = np.array([1, 77, 1031, 1499], np.int32)
        q = rng.standard_normal((len(lengths), H, hd)).astype(np.float32)
        ws = cp.zeros(ops.attn_decode_workspace_bytes(H, K, hd), cp.uint8)
        o = cp.full((len(lengths), H, hd), np.nan, cp.float32)
        ops.attn_decode(cp.asarray(q), ck, cv, kv_type, cp.asarray(lengths), len(lengths), scale, o, ws)
        ref = kr.attention_ref(q, kv, vv, lengths - 1, scale)
        err = _rel(cp.asnumpy(o), ref)
        how = "tensor cores" if ops.decode_on_tensor_cores(kv_type, hd) else "fma"
        out.append((f"attention decode kv={kv_type} ({how})", f"rel {err:.1e}", "2e-3", err <= 2e-3))
        T, start = 133, 1001
        qp = rng.standard_normal((T, H, hd)).astype(np.float32)
        op = cp.full((T, H, hd), np.nan, cp.float32)
        ops.attn_prefill(cp.asarray(qp), ck, cv, kv_type, start, T, scale, op)
        err = _rel(cp.asnumpy(op), kr.attention_ref(qp, kv, vv, np.arange(start, start + T), scale))
        out.append((f"attention prefill kv={kv_type}", f"rel {err:.1e}", "2e-3", err <= 2e-3))
    return out


def per_expert_prefill(cp, ex, h, ids, w, shared, res, act_bf16: bool = False, impl: str | None = "mma"):
    """res + the routed experts (T rows of h through ids / w) + shared, as per-expert dense GEMMs:
    each expert's rows gathered, lin.gemm on ``impl``'s kernels (gate|up, swiglu, down), scattered
    into Y (T, k, D), moe_combine.  On the portable kernels ("mma") this is what the grouped
    prefill (moe_group.cu) equals bit for bit.  Only the experts ``ex`` holds (ex.held: a GPU of a
    split model); res None: their partial sum alone (moe_combine's add 0)."""
    from .backends import cuda_linear as lin
    from .backends import cuda_moe, cuda_ops

    T, k = ids.shape
    F, D = ex.gu.out // 2, ex.gu.in_
    hd = cp.asarray(h)
    Y = cp.zeros((T, k, D), cp.float32)
    lo, hi = ex.held
    for e in np.unique(ids):
        if not lo <= e < hi:
            continue
        rows, slots = np.nonzero(ids == e)
        n = len(rows)
        W_gu, W_down = ex.weights(int(e))
        gu = cp.empty((n, 2 * F), cp.float32)
        lin.gemm(W_gu, cp.ascontiguousarray(hd[cp.asarray(rows)]), gu, n, act_bf16=act_bf16, impl=impl)
        act = cp.empty((n, F), cp.float32)
        cuda_ops.swiglu(gu, act)
        y = cp.empty((n, D), cp.float32)
        lin.gemm(W_down, act, y, n, act_bf16=act_bf16, impl=impl)
        Y[cp.asarray(rows), cp.asarray(slots)] = y
    out = cp.zeros((T, D), cp.float32) if res is None else cp.asarray(res)
    cuda_moe.combine(Y, cp.asarray(w), None if shared is None else cp.asarray(shared), out, T, k,
                     cp.asarray(np.asarray(ids, np.int32)), held=ex.held, add=res is not None)
    return cp.asnumpy(out)


def check_moe_prefill(cp, rng) -> list[tuple]:
    """The grouped MoE prefill: moe_group = kernel_refs.moe_group_ref exactly; the grouped GEMMs +
    moe_combine against NumpyOps.experts (the integer-dot contract on both sides where the format
    has it) and bit for bit against the per-expert GEMMs on the same (portable) kernels."""
    from .backends import cuda_moe
    from .backends.kernel_refs import act_q8, moe_group_ref
    from .backends.numpy_backend import NumpyBackend
    from .loaders.tensor import ExpertTensor
    from .synthetic import random_experts

    out = []
    E, k, D, F = 9, 3, 512, 256
    for fmt in ("BF16", "Q8_0", "Q4_K", "NVFP4", "MXFP4", "Q2_K", "Q3_K"):
        T = int(rng.integers(100, 300))
        g, u, d = (ExpertTensor(nm, random_experts(fmt, E, r, c, rng)) for nm, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
        ex = cuda_moe.load_experts(g, u, d)
        ids = np.stack([rng.permutation(E - 1)[:k] + 1 for _ in range(T)]).astype(np.int32)  # expert 0: no rows
        grp = cuda_moe.group(cp.asarray(ids), T, k, E, cuda_moe.group_tile(T * k, E))
        bad = sum(int(np.count_nonzero(cp.asnumpy(a) != b))
                  for a, b in zip((grp.offs, grp.toff, grp.tok, grp.pos), moe_group_ref(ids, E, grp.bm)))
        out.append((f"moe_group {fmt} T={T}", f"{bad} mismatches", "0", bad == 0))
        h = rng.standard_normal((T, D)).astype(np.float32)
        w = rng.random((T, k)).astype(np.float32)
        zero = np.zeros((T, D), np.float32)
        got = cp.asarray(zero)
        cuda_moe.prefill_experts(ex, cp.asarray(h), cp.asarray(ids), cp.asarray(w), None, got, T, k)
        got = cp.asnumpy(got)
        nb = NumpyBackend(act_quant=act_q8(fmt))
        ops = nb.ops(nb.new_kv_cache(1, 1, 16, 16), 0, T, 1e-6)
        ref = ops.experts(h, ids, w, nb.load_experts(g, u, d), zero)
        err = _rel(got, ref)
        same = np.array_equal(got.view(np.uint32), per_expert_prefill(cp, ex, h, ids, w, None, zero).view(np.uint32))
        out.append((f"grouped expert prefill {fmt} T={T}", f"rel {err:.1e}, per-expert GEMMs {'bit-equal' if same else 'DIFFER'}",
                    "1e-4, equal", err <= 1e-4 and same))
    return out


def check_moe_decode(cp, rng) -> list[tuple]:
    """The decode experts (moe_gu with the rmsnorm staged, moe_down with the shared expert and the
    residual) of every format against NumpyOps.experts (the integer-dot contract on both sides
    where the format has it), m = 1..5 rows of fresh random ids, weights and inputs; and each row
    of the m-row launches bit-equal to a one-row launch (speculative verify = plain decode)."""
    from .backends import cuda_moe
    from .backends.kernel_refs import act_q8
    from .backends.numpy_backend import NumpyBackend
    from .loaders.tensor import ExpertTensor
    from .synthetic import random_experts

    out = []
    E, k, D, F = 11, 3, 512, 256  # moe_down's units: 8 chunks of the 32-value formats (16 of Q8_0) per 8 lanes
    for fmt in [f for f in FORMATS if f != "F32"]:  # checkpoints store no F32 experts (and synthetic has none)
        m = int(rng.integers(1, 6))
        g, u, d = (ExpertTensor(nm, random_experts(fmt, E, r, c, rng)) for nm, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
        ex = cuda_moe.load_experts(g, u, d)
        x = rng.standard_normal((m, D)).astype(np.float32)
        nw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        ids = np.stack([rng.permutation(E)[:k] for _ in range(m)]).astype(np.int32)
        w = rng.random((m, k)).astype(np.float32)
        shared = rng.standard_normal((m, D)).astype(np.float32)
        res = rng.standard_normal((m, D)).astype(np.float32)

        def run(r0: int, r1: int) -> np.ndarray:
            n = r1 - r0
            act, o = cp.zeros((n, k, F), cp.float32), cp.asarray(res[r0:r1])
            idd = cp.asarray(ids[r0:r1])
            cuda_moe.experts_gu(ex, cp.asarray(x[r0:r1]), idd, act, n, k, norm_w=cp.asarray(nw), eps=1e-6)
            cuda_moe.experts_down(ex, act, idd, cp.asarray(w[r0:r1]), cp.asarray(shared[r0:r1]), o, n, k)
            return cp.asnumpy(o)

        got = run(0, m)
        nb = NumpyBackend(act_quant=act_q8(fmt))
        ops = nb.ops(nb.new_kv_cache(1, 1, 16, 16), 0, m, 1e-6)
        routed = ops.experts(ops.rmsnorm(x, nw), ids, w, nb.load_experts(g, u, d), np.zeros_like(res))
        want = res + (routed + shared)  # the contract's order: routed sum, + shared, then the residual
        err = float(np.linalg.norm(got - want) / np.linalg.norm(routed))
        rows = np.concatenate([run(i, i + 1) for i in range(m)])
        same = np.array_equal(got.view(np.uint32), rows.view(np.uint32))
        out.append((f"moe decode experts {fmt} m={m}", f"rel {err:.1e}, rows {'bit-equal' if same else 'DIFFER'} to 1-row",
                    "1e-4, equal", err <= 1e-4 and same))
    return out


def check_repack(cp, rng) -> list[tuple]:
    """kernels/repack.cu (the expert file tier's images): an expert's tensors as the checkpoint
    holds them, repacked on the GPU, against the host's image (ExpertSource.image: repack_host's
    planes): every plane byte for byte, every format, fresh random experts."""
    from .backends import cuda_moe
    from .loaders.tensor import ExpertTensor
    from .synthetic import random_experts

    out = []
    E, D, F = 2, 512, 256
    for fmt in [f for f in FORMATS if f != "F32"]:  # checkpoints store no F32 experts (and synthetic has none)
        g, u, d = (ExpertTensor(nm, random_experts(fmt, E, r, c, rng)) for nm, r, c in (("g", F, D), ("u", F, D), ("d", D, F)))
        src = cuda_moe.load_experts(g, u, d, slots=1).source
        bad = 0
        for e in range(E):
            raw = np.empty(src.raw_bytes, np.uint8)
            src.raw_into(e, raw)
            dev_raw, img = cp.asarray(raw), cp.zeros(src.image_bytes, cp.uint8)
            src.repack_on_device(e, int(dev_raw.data.ptr), int(img.data.ptr))
            got, want = cp.asnumpy(img), src.image(e)
            for lay in src.layouts:
                for _name, off, shape, dt in lay.planes:
                    n = int(np.prod(shape)) * np.dtype(dt).itemsize
                    bad += int(np.count_nonzero(got[off:off + n] != want[off:off + n]))
        out.append((f"repack expert images {fmt}", f"{bad} byte mismatches", "0", bad == 0))
    return out


def check_sampling(cp, rng) -> list[tuple]:
    from .backends import cuda_ops as ops
    from .sampling import sample_token

    V, n = 151936, 40
    same = total = 0
    ws = cp.zeros(ops.sample_workspace_bytes(V), cp.uint8)
    tok = cp.zeros(1, cp.int32)
    ring = cp.zeros(256, cp.int32)
    rows = [cp.zeros((n, V), cp.float32), cp.zeros((n, 16), cp.uint64), cp.zeros((n, 256), cp.int32), np.zeros(n, np.int32)]
    singles = []
    for i in range(n):
        logits = (rng.standard_normal(V) * rng.uniform(0.5, 4)).astype(np.float32)
        p = SamplingParams(temperature=float(rng.choice([0.0, 0.7, 1.0, 1.3])), top_k=int(rng.choice([0, 1, 40])),
                           top_p=float(rng.choice([1.0, 0.9, 0.5])), min_p=float(rng.choice([0.0, 0.05])),
                           repeat_penalty=float(rng.choice([1.0, 1.2])), repeat_last_n=64)
        seed, pos = int(rng.integers(0, 2**63)), int(rng.integers(0, 100000))
        hist = [int(h) for h in rng.integers(0, V, 64)]
        ring[:64] = cp.asarray(np.asarray(hist, np.int32))
        params = cp.asarray(ops.pack_sampling_params(p, seed, 64 if p.repeat_penalty != 1.0 else 0))
        rows[0][i], rows[1][i], rows[2][i], rows[3][i] = cp.asarray(logits), params, ring, pos
        ops.sample(cp.asarray(logits), params, tok, ring, cp.asarray(np.array([pos], np.int32)), ws)
        singles.append(int(tok.get()[0]))
        same += int(singles[-1] == sample_token(logits, p, seed, pos, hist))
        total += 1
    # the same rows in one launch (a verify's or a batched pass's rows): each row's token as alone
    out = cp.full(n, -1, cp.int32)
    ops.sample(rows[0], rows[1], out, rows[2], cp.asarray(rows[3]), cp.zeros(ops.sample_workspace_bytes(V, n), cp.uint8))
    rows_same = int((out.get() == np.asarray(singles)).sum())
    return [("device sampler = NumPy sampler", f"{same}/{total} equal", "all", same == total),
            (f"device sampler: {n} rows in one launch = one-row launches", f"{rows_same}/{n} equal", "all", rows_same == n)]


def check_deltanet(cp, rng) -> list[tuple]:
    """deltanet.cu and deltanet_chunk.cu at Qwen3.5-9B's heads (16 key, 32 value heads of 128) and
    an odd shape: conv1d and the delta rule's recurrence against float64 over a pass that spans
    tiles, the pass's rows bit-equal to one-row launches (decode steps), the chunked prefill
    against float64, the gated RMSNorm."""
    from .backends import cuda_deltanet as dn
    from .backends.numpy_backend import causal_conv1d_ref, gated_delta_rule_ref, gated_rmsnorm_ref
    from .ops import DeltaNetSpec

    out = []
    f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
    for spec in (DeltaNetSpec(16, 32, 128, 128, 4, 1e-6), DeltaNetSpec(3, 6, 40, 17, 3, 1e-6, "tiled")):
        T, C, Hv = 41, spec.conv_dim, spec.n_v_heads
        x = rng.standard_normal((T, C)).astype(np.float32)
        w = (0.5 * rng.standard_normal((C, spec.conv_kernel))).astype(np.float32)
        st = cp.zeros((spec.conv_kernel - 1, C), cp.float32)
        y = cp.full((T, C), np.nan, cp.float32)
        dn.conv1d(cp.asarray(x), cp.asarray(w), st, y, T)
        ref, _ = causal_conv1d_ref(f64(x), f64(w), np.zeros((spec.conv_kernel - 1, C)))
        err = _rel(cp.asnumpy(y), ref)
        tag = f"Hv={Hv} dk={spec.k_head_dim} dv={spec.v_head_dim}"
        out.append((f"deltanet conv1d C={C}", f"rel {err:.1e}", "1e-6", err <= 1e-6))
        b, a = rng.standard_normal((T, Hv)).astype(np.float32), (3 * rng.standard_normal((T, Hv))).astype(np.float32)
        A, dt = -np.exp(rng.standard_normal(Hv)).astype(np.float32), rng.standard_normal(Hv).astype(np.float32)
        qkv = cp.asnumpy(y)
        ref_o, ref_S = gated_delta_rule_ref(f64(qkv), f64(b), f64(a), f64(A), f64(dt), spec,
                                            np.zeros((Hv, spec.k_head_dim, spec.v_head_dim)))
        args = [cp.asarray(v) for v in (b, a, A, dt)]
        shape = (Hv, spec.v_head_dim, spec.k_head_dim)
        S, o = cp.zeros(shape, cp.float32), cp.full((T, Hv * spec.v_head_dim), np.nan, cp.float32)
        dn.recurrent(y, *args[:2], *args[2:], spec, S, o, T)
        S1, rows = cp.zeros(shape, cp.float32), []
        for t in range(T):  # one-row launches: decode steps over the same inputs
            o1 = cp.empty((1, Hv * spec.v_head_dim), cp.float32)
            dn.recurrent(y[t:t + 1], args[0][t:t + 1], args[1][t:t + 1], *args[2:], spec, S1, o1, 1)
            rows.append(cp.asnumpy(o1))
        o, S = cp.asnumpy(o), cp.asnumpy(S)
        err = max(_rel(o, ref_o), _rel(S.transpose(0, 2, 1), ref_S))
        same = np.array_equal(np.concatenate(rows).view(np.uint32), o.view(np.uint32)) and \
            np.array_equal(cp.asnumpy(S1).view(np.uint32), S.view(np.uint32))
        out.append((f"deltanet recurrence {tag} T={T}", f"rel {err:.1e}, rows {'bit-equal' if same else 'DIFFER'}",
                    "1e-4, equal", err <= 1e-4 and same))
        # the chunked prefill (deltanet_chunk.cu) over 2 whole chunks and a partial one
        Tc = 150
        qc = rng.standard_normal((Tc, C)).astype(np.float32)
        bc, ac = rng.standard_normal((Tc, Hv)).astype(np.float32), (3 * rng.standard_normal((Tc, Hv))).astype(np.float32)
        ref_o, ref_S = gated_delta_rule_ref(f64(qc), f64(bc), f64(ac), f64(A), f64(dt), spec,
                                            np.zeros((Hv, spec.k_head_dim, spec.v_head_dim)))
        ws = [cp.empty(s, cp.float32) for s in dn.chunk_workspace_shapes(spec, 3).values()]
        Sc, oc = cp.zeros(shape, cp.float32), cp.full((Tc, Hv * spec.v_head_dim), np.nan, cp.float32)
        dn.chunked(cp.asarray(qc), cp.asarray(bc), cp.asarray(ac), *args[2:], spec, Sc, oc, Tc, *ws)
        err = max(_rel(cp.asnumpy(oc), ref_o), _rel(cp.asnumpy(Sc).transpose(0, 2, 1), ref_S))
        out.append((f"deltanet chunked prefill {tag} T={Tc}", f"rel {err:.1e}", "5e-5", err <= 5e-5))
        z = rng.standard_normal((T, Hv * spec.v_head_dim)).astype(np.float32)
        nw = rng.uniform(0.5, 1.5, spec.v_head_dim).astype(np.float32)
        g = cp.full((T, Hv * spec.v_head_dim), np.nan, cp.float32)
        dn.gated_norm(cp.asarray(o), cp.asarray(z), cp.asarray(nw), spec.eps, g, spec, T)
        err = _rel(cp.asnumpy(g), gated_rmsnorm_ref(f64(o), f64(z), f64(nw), spec))
        out.append((f"deltanet gated rmsnorm {tag}", f"rel {err:.1e}", "1e-6", err <= 1e-6))
    return out


def run_all() -> list[tuple]:
    import cupy as cp

    rng = np.random.default_rng()
    res = []
    for fn in (check_linear, check_norm_rope, check_attention, check_moe_decode, check_moe_prefill, check_repack,
               check_deltanet, check_sampling):
        try:
            res += fn(cp, rng)
        except Exception as exc:  # noqa: BLE001 - a crashing family is a failed check, reported
            res.append((fn.__name__, f"{type(exc).__name__}: {str(exc)[:80]}", "runs", False))
    return res
