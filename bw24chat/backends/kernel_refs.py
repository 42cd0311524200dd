"""NumPy references for the CUDA op contracts that numpy_backend.py / rope.py / sampling.py do not
already state: KV-cache storage (bf16, q8_0, fp8 E4M3 rounding and layout), the decode split
rule, attention over the stored (rounded) cache, the two-half rmsnorm of ops.concat, and
Philox4x64-10 raw outputs.

RMSNorm, RoPE, SwiGLU and the sampling contract are NOT restated here: the tests compare the
kernels with ``NumpyBackend.rmsnorm``, ``rope.apply_rope`` and ``sampling.sample_token``.  The
QK-norm of rope.cu is (``qk_norm_ref``): its sums run in an order of their own, which is part of
its contract.

KV cache layouts (one per layer, for K and for V alike; N = n_ctx, K = kv heads, hd = head dim):
  bf16  uint16 (N, K, hd): bf16 bits, round-to-nearest-even from float32.
  q8_0  uint8 (N, K, hd*17/16) = N*K*hd*17/16 bytes, planar: int8 codes (N, K, hd) first, then the f16
        scales (N, K, hd/32).  Per 32 consecutive values of one head vector, ggml's
        quantize_row_q8_0_ref: d = amax/127, id = d ? 1/d : 0, q = roundf(x*id) (half away
        from zero), d stored as f16.  Planar (not ggml's interleaved 34-byte blocks) so that
        code rows stay 16-byte aligned for vector loads whatever hd is.
  fp8   uint8 (N, K, hd+4) = N*K*(hd+4) bytes, planar: E4M3 codes (N, K, hd), then f32 scales (N, K).
        One scale per head vector: d = amax/448, code = e4m3_rn_satfinite(x / d).  Chosen over a
        fixed scale because keys carry per-token outlier magnitudes that a fixed scale would clip
        or crush without calibration data; one f32 per vector costs 4/hd bytes (3% at hd=128).
  f32   float32 (N, K, hd): the values themselves (the exact reference cache: the NumPy backend
        and transformers keep float32 K/V).
The (N, K, ...) shape only carries N and K; the bytes are not indexed by it.
Dequantized values are code * d in float32 (q8_0: d is the f16 scale widened to float32).

Shape legend: T query tokens, H query heads, K kv heads, G = H/K, hd head dim, S keys, V vocab.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..quants import f32_to_bf16_bits

KV_TYPES = ("bf16", "q8_0", "fp8", "f32")
E4M3_MAX = 448.0

# --------------------------------------------------------------------------- bf16 / fp8 rounding


bf16_round_bits = f32_to_bf16_bits  # float32 -> bf16 bits, round to nearest even (quants.py)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(bf16_round_bits(x))


# --------------------------------------------------------------------------- integer-dot activations


# The integer-dot linear contract: the activations are quantized per 32 inputs into two int8
# code levels with power-of-two scales (act_quant_ref: 2^e (h + l/256), 15 significant bits)
# before the product, in decode (dp4a matvec) and prefill (the GEMM takes the two levels as its
# exact bf16 hi / lo planes) alike.  Decided by measurement (H200, Qwen3-8B shape, docs/performance.md):
# the float decoders of these formats are instruction-bound at 25-45 % of the weight bandwidth.
# One int8 level (llama.cpp's q8_1) was faster still but failed the prefill-vs-decode gate: its
# whole-step flips turn the two paths' rounding-level differences into argmax mismatches on
# random models; two levels make a flip 256 times smaller.  Q4_0/Q4_1/Q5_0/Q5_1 keep exact
# activations (SmolLM2 Q4_1 is gated on the NumPy backend's numbers).  NVFP4: the integer dot
# (E2M1 by table to doubled integers) measured 7 % faster per layer than the f16 tensor-core
# matvec (74.0 vs 79.8 us).  MXFP4 takes NVFP4's integer dot (its power-of-two block scale rides
# in the x record's scale); Q3_K Q6_K's (two scales a chunk, a code offset), Q2_K the same with
# a min per half chunk.
A8_FORMATS: tuple = ("Q8_0", "Q4_K", "Q5_K", "Q6_K", "NVFP4", "MXFP4", "Q2_K", "Q3_K")


FLOAT_FORMATS = ("F32", "F16", "BF16")  # the unquantized weight formats


def act_q8(fmt: str) -> bool:
    """Whether weights of ``fmt`` use the integer-dot contract: BW24CHAT_A8 = a comma list of
    formats, "all" (every quantized format supports it) or "none"; default A8_FORMATS."""
    env = os.environ.get("BW24CHAT_A8", "")
    if not env:
        return fmt in A8_FORMATS
    if env == "none":
        return False
    if env == "all":
        return fmt not in FLOAT_FORMATS
    return fmt in {f.strip().upper() for f in env.split(",")}


ACT_BLOCK = 32


def act_quant_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation quantization of the integer-dot linear contract (kernels/common.cuh
    act_quant_lane): x float32 [..., n], n a multiple of 32; per block of 32 consecutive inputs
    e = max(floor(log2 amax), -100) - 6 (amax's exponent bits; a subnormal or zero amax counts
    as -127), r = x * 2^-e, h = clamp(floor(r + 1/2), -128, 127) (r + 1/2 in float32), l =
    clamp(rint((r - h) * 256), -128, 127), rint half to even: r - h in [-1/2, 1/2), so a bf16 x
    of at least 2^(e-1) is exact.  Returns (h int8 [..., n], l int8 [..., n], e int32 [..., n/32])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % ACT_BLOCK:
        raise ValueError("the integer-dot contract quantizes whole blocks of 32 inputs")
    xb = x.reshape(*x.shape[:-1], -1, ACT_BLOCK)
    amax = np.max(np.abs(xb), axis=-1)
    biased = ((amax.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32)
    e = np.maximum(biased - 127, -100) - 6
    r = xb * _pow2(-e)[..., None]  # exact
    h = np.clip(np.floor(r + np.float32(0.5)), -128, 127)
    l = np.clip(np.rint((r - h) * np.float32(256)), -128, 127)  # r - h exact
    return h.astype(np.int8).reshape(x.shape), l.astype(np.int8).reshape(x.shape), e


def qx_row_words(n: int) -> int:
    """uint32 words of one row of n inputs in the QX buffer (common.cuh qx_row_words)."""
    return 5 * n // 8


def qx_ref(x: np.ndarray) -> np.ndarray:
    """The QX buffer of x float32 [m, n] (matvec.cu's contract: the integer-dot codes of an
    activation row, written once by its producer and copied by the consumer's prologue): per row
    uint32 words [h codes n/4 | l codes n/4 | n/32 records of 4 int32 {e, sum h of inputs 0-15,
    of 16-31, (sum l of 0-15 & 0xFFFF) | (sum l of 16-31) << 16}], codes as act_quant_codes."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    m, n = x.shape
    h, l, e = act_quant_codes(x)
    half = lambda c: c.astype(np.int32).reshape(m, n // 32, 2, 16).sum(-1)  # [m, blocks, half]
    sh, sl = half(h), half(l)
    rec = np.stack([e, sh[..., 0], sh[..., 1], (sl[..., 0] & 0xFFFF) | (sl[..., 1] << 16)], -1).astype(np.int32)
    words = [h.view(np.uint8).view(np.uint32), l.view(np.uint8).view(np.uint32), rec.reshape(m, -1).view(np.uint32)]
    return np.concatenate(words, axis=1)


# --------------------------------------------------------------------------- MoE prefill grouping


def moe_group_ref(ids: np.ndarray, E: int, bm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """moe_group.cu moe_group: a chunk's assignments ids [T, k] (a = t k + j) grouped by expert.
    Returns offs [E + 1] (exclusive scan of the counts: expert e's grouped rows are [offs[e],
    offs[e + 1])), toff [E + 1] (the same of the tiles ceil(count / bm)), tok [T k] (grouped row
    r's token: each expert's assignments in ascending a) and pos [T k] (pos[a] = its row r), all
    int32."""
    T, k = ids.shape
    flat = np.asarray(ids, np.int64).reshape(-1)
    counts = np.bincount(flat, minlength=E)
    offs = np.zeros(E + 1, np.int32)
    offs[1:] = np.cumsum(counts)
    toff = np.zeros(E + 1, np.int32)
    toff[1:] = np.cumsum(-(-counts // bm))
    order = np.argsort(flat, kind="stable")  # by expert, ascending a within one
    pos = np.empty(T * k, np.int32)
    pos[order] = np.arange(T * k, dtype=np.int32)
    return offs, toff, (order // k).astype(np.int32), pos


def rmsnorm_concat_ref(xa: np.ndarray, wa, xb: np.ndarray, wb, eps: float) -> np.ndarray:
    """norm.cu rmsnorm_concat: [rmsnorm(xa) * wa | rmsnorm(xb) * wb] (a half whose weight is None
    as is), float32: NumpyOps.concat of two NumpyOps.rmsnorm values."""
    from .numpy_backend import rmsnorm_ref

    half = lambda x, w: np.asarray(x, np.float32) if w is None else rmsnorm_ref(np.asarray(x, np.float32), w, eps)  # noqa: E731
    return np.concatenate([half(xa, wa), half(xb, wb)], axis=-1)


def matvec_prologue_f32(x: np.ndarray, prologue: str, in_: int, norm_w=None, eps: float = 1e-6) -> np.ndarray:
    """The decode matvec's prologue in float32 with the kernels' formulas (numpy_backend):
    "rmsnorm" of x [m, in_], "swiglu" of x [m, 2 in_] = gate | up, else x."""
    from .numpy_backend import rmsnorm_ref, swiglu_ref

    x32 = np.asarray(x, dtype=np.float32)
    if prologue == "rmsnorm":
        return rmsnorm_ref(x32, norm_w, eps)
    if prologue == "swiglu":
        return swiglu_ref(x32[:, :in_], x32[:, in_:])
    return x32


def matvec_ref_input(x: np.ndarray, prologue: str, in_: int, norm_w=None, eps: float = 1e-6, a8: bool = False) -> np.ndarray:
    """The float64 input of the decode matvec's product (kernels/matvec.cu, matvec_tc.cu): the
    prologue in float64, or under the integer-dot contract (a8) the float32 prologue quantized
    (act_quant_ref).  matvec_ref is its product with the exact weights."""
    if a8:
        return act_quant_ref(matvec_prologue_f32(x, prologue, in_, norm_w, eps)).astype(np.float64)
    x = np.asarray(x, dtype=np.float64)
    if prologue == "rmsnorm":
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(norm_w, dtype=np.float64)
    if prologue == "swiglu":
        g, u = x[:, :in_], x[:, in_:]
        return g / (1.0 + np.exp(-g)) * u
    return x


def matvec_ref(x: np.ndarray, w: np.ndarray, prologue: str = "none", norm_w=None, eps: float = 1e-6,
               a8: bool = False) -> np.ndarray:
    """y[m, o] = sum_k x'[m, k] w[o, k] in float64, x' = matvec_ref_input (w: the exact weights)."""
    return matvec_ref_input(x, prologue, w.shape[1], norm_w, eps, a8) @ np.asarray(w, dtype=np.float64).T


def _pow2(e: np.ndarray) -> np.ndarray:
    return ((127 + np.asarray(e)).astype(np.uint32) << np.uint32(23)).view(np.float32)


def act_quant_ref(x: np.ndarray) -> np.ndarray:
    """The quantized activations 2^e (h + l / 256) as float32 (exact)."""
    h, l, e = act_quant_codes(x)
    hb = h.reshape(*h.shape[:-1], -1, ACT_BLOCK).astype(np.float32) * _pow2(e)[..., None]
    lb = l.reshape(hb.shape).astype(np.float32) * _pow2(e - 8)[..., None]
    return (hb + lb).reshape(h.shape).astype(np.float32)


def fma32(a, b, c) -> np.ndarray:
    """float32 a * b + c with one rounding (CUDA __fmaf_rn): the product is exact in float64 (24 + 24
    bits), the sum is rounded to odd in float64 (TwoSum's error term sets the last bit), and the
    float32 rounding of that is the correctly rounded result (53 >= 24 + 2 bits; Boldo and
    Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to
    odd", IEEE Trans. Computers 2008).  Finite inputs."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c64 = np.asarray(c, np.float32).astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # the exact p + c - s
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


A8_EXACT_FORMATS = ("Q8_0", "NVFP4", "Q4_K")  # the formats matvec_a8_exact (and matvec_mma.cu) take


def _a8_chain_steps(hp, x: np.ndarray, kc0: int = 0, kc1: int | None = None) -> tuple[list, int]:
    """The integer-dot matvec's per-chunk chain steps (dot_a8.cuh chunk_dot_a8) of x float32
    [m, in] against the repacked weights hp: a list of (d, s) float32 [m, out, nck], each step
    acc = fma(d[kc], s[kc], acc) in list order per chunk; and nck.  x quantized per 32 inputs
    (act_quant_codes); d the exact integer dots (Q8_0 per level p = h, l: dot_p; NVFP4 per half:
    256 dot_h + dot_l; Q4_K 256 dot_h + dot_l, then the min step), s the scale products as
    float32 rounds them (Q8_0 d * 2^e_p; NVFP4 (E4M3 * 2^-8) * 2^(e-1); Q4_K (d sc) * 2^(e-8),
    then the min -dmin mn against the block's exact x sum 2^(e-8) (256 sum h + sum l)), e_h = e,
    e_l = e - 8.  kc0, kc1: the steps of chunks [kc0, kc1) only (nck = kc1 - kc0, the chunks
    counted from kc0; kc0 on a 32-input block), their inputs quantized by themselves as a K range
    of matvec_mma.cu stages them."""
    from .cuda_weights import chunk_codes, vpc

    fmt, out, n = hp.fmt, hp.out, hp.in_
    if fmt not in A8_EXACT_FORMATS:
        raise ValueError(f"the exact integer-dot rows are modelled for {A8_EXACT_FORMATS}, not {fmt}")
    x = np.atleast_2d(np.asarray(x, np.float32))
    m, V = x.shape[0], vpc(fmt)
    kc1 = n // V if kc1 is None else kc1
    nck = kc1 - kc0
    h, l, e = act_quant_codes(x[:, kc0 * V:kc1 * V])
    q, a0, a1, b0, _ = chunk_codes(hp)
    q, a0, a1, b0 = (None if a is None else a[:, kc0:kc1] for a in (q, a0, a1, b0))
    qi = q.astype(np.int64)  # [out, nck, V]
    codes = {"h": h.astype(np.int64).reshape(m, nck, V), "l": l.astype(np.int64).reshape(m, nck, V)}
    eb = e[:, np.arange(nck) // (32 // V)]  # [m, nck]: each chunk's activation block exponent
    f = lambda v: np.asarray(v, np.float64).astype(np.float32)  # noqa: E731  (exact: integers < 2^24)
    dot = lambda p, sl=slice(None): np.einsum("mkv,okv->mok", codes[p][..., sl], qi[..., sl])  # noqa: E731
    csum = lambda p: codes[p].sum(-1)[:, None, :]  # noqa: E731  [m, 1, nck]
    scale = lambda a, k: a[None, :, :, 0] * _pow2(eb + k)[:, None, :]  # noqa: E731  float32 [m, out, nck]
    lo, hi = slice(0, 16), slice(16, 32)
    if fmt == "Q8_0":
        return [(f(dot("h")), scale(a0, 0)), (f(dot("l")), scale(a0, -8))], nck
    if fmt == "NVFP4":  # E4M3 * 2^-8 = (ue4m3 / 2) * 2^-7, against 2^(e-1)
        s0, s1 = a0 * np.float32(2.0**-7), a1 * np.float32(2.0**-7)
        return [(f(256 * dot("h", sl) + dot("l", sl)), scale(sc, -1)) for sl, sc in ((lo, s0), (hi, s1))], nck
    xsum = f(256 * csum("h") + csum("l")) * _pow2(eb - 8)[:, None, :]
    return [(f(256 * dot("h") + dot("l")), scale(a0, -8)), (np.broadcast_to(b0[None, :, :, 0], (m, out, nck)), xsum)], nck


def _a8_chains(steps: list, nck: int, lanes_of, acc: np.ndarray | None = None) -> np.ndarray:
    """The chains' f32 accumulators [m, out, K] after every step: chunk kc feeds chain
    lanes_of(kc) (an int array over kc), each chain's chunks in increasing order, from +0 (or
    from acc, a copy: the chains a K range before left)."""
    m, out, _ = steps[0][0].shape
    kc = np.arange(nck)
    chain = lanes_of(kc)
    if acc is None:
        acc = np.zeros((m, out, int(chain.max()) + 1 if nck else 1), np.float32)
    else:
        acc = np.array(acc, np.float32)
    for i in range(-(-nck // 32)):  # a chain takes at most one chunk of each 32
        sel = kc[32 * i:32 * i + 32]
        for d, s in steps:
            d, s = np.broadcast_to(d, (m, out, nck)), np.broadcast_to(s, (m, out, nck))
            acc[..., chain[sel]] = fma32(d[..., sel], s[..., sel], acc[..., chain[sel]])
    return acc


def matvec_a8_exact(hp, x: np.ndarray) -> np.ndarray:
    """The integer-dot decode matvec's rows bit for bit (matvec.cu ACT_Q8; prologue none, store):
    y float32 [m, out] from x float32 [m, in] and the repacked weights hp (cuda_weights.repack_host;
    A8_EXACT_FORMATS).  The kernels' reduction order, which is their contract: 32 chains L take
    the chunks kc = L, L + 32, ... in increasing order (_a8_chain_steps), each an f32 accumulator
    from +0; then the xor tree of warp_sum over L (levels 16, 8, 4, 2, 1: v[L] + v[L + o] for
    L < o) and NVFP4's per-row global scale.  float32 products and sums as NumPy rounds them,
    FMAs by fma32."""
    steps, nck = _a8_chain_steps(hp, x)
    acc = np.zeros(steps[0][0].shape[:2] + (32,), np.float32)
    got = _a8_chains(steps, nck, lambda kc: kc % 32)
    acc[..., :got.shape[-1]] = got
    for o in (16, 8, 4, 2, 1):
        acc = acc[..., :o] + acc[..., o:2 * o]
    y = acc[..., 0]
    return y * hp.gscale[None, :] if hp.gscale is not None else y


def matvec_a8_mma_order(hp, x: np.ndarray, kw: int = 8, kt_bounds: tuple | None = None) -> np.ndarray:
    """matvec_mma.cu's schedule of the same rows (its header): warp kw' of a 16-row sub-tile (kw
    warps) keeps chains (i, c) for the chunk pairs (2 kw' + 2 kw i, +1), i < 16 / kw, of every
    32-chunk k-tile; at a pass's end it adds its chains i and i + h (h = 8 / kw, ..., 1: the xor
    tree's levels 16 .. 2 kw), leaving the residue r = 2 kw' + c; the block adds the residues
    r and r + o for o = kw, ..., 1.  kt_bounds: its K ranges (cuda_linear.mma_ranges: k-tile
    bounds 0, ..., all k-tiles), one launch per range, each staging its range's inputs alone
    (quantized by themselves) and continuing the chains the range before stored as float32; the
    last range's chains folded.  Equal to matvec_a8_exact bit for bit, split or not: the same
    chain steps in the same order, the same pairs added (tests/test_matvec_mma_order.py)."""
    if kw not in (4, 8):
        raise ValueError("matvec_mma.cu: 4 or 8 warps per 16-row sub-tile")
    from .cuda_weights import vpc

    nck = hp.in_ // vpc(hp.fmt)
    bounds = (0, -(-nck // 32)) if kt_bounds is None else tuple(kt_bounds)
    npairs = 16 // kw

    def chain_of(kc):  # chunk kc (of a range starting on a k-tile) -> (warp, pair, chunk in pair) flattened
        local = kc % 32
        warp, pair, c = (local // 2) % kw, local // (2 * kw), local % 2
        return (warp * npairs + pair) * 2 + c

    x = np.atleast_2d(np.asarray(x, np.float32))
    part = np.zeros((x.shape[0], hp.out, kw * npairs * 2), np.float32)  # the chains between the ranges' launches
    for kt0, kt1 in zip(bounds, bounds[1:]):
        steps, n = _a8_chain_steps(hp, x, 32 * kt0, min(32 * kt1, nck))
        part = _a8_chains(steps, n, chain_of, part)
    ch = part.reshape(part.shape[:2] + (kw, npairs, 2))  # [m, out, warp, pair, c]
    h = npairs // 2
    while h >= 1:  # the warp's own levels: pairs i, i + h
        ch = ch[..., :h, :] + ch[..., h:2 * h, :]
        h //= 2
    v = ch[..., 0, :].reshape(part.shape[:2] + (2 * kw,))  # residue r = 2 warp + c
    o = kw
    while o >= 1:  # the block's levels over the residues
        v = v[..., :o] + v[..., o:2 * o]
        o //= 2
    y = v[..., 0]
    return y * hp.gscale[None, :] if hp.gscale is not None else y


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest E4M3 value (ties to even), saturated to +-448 (cvt.rn.satfinite)."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)
    _, e = np.frexp(np.where(a > 0, a, 1.0))  # a = m * 2^e, m in [0.5, 1)
    exp = np.maximum(e - 1, -6)  # unbiased exponent, subnormals share 2^-6
    step = np.ldexp(1.0, exp - 3)  # 3 mantissa bits
    q = np.round(a / step) * step  # np.round: half to even; a/step exact (power of two)
    return (np.sign(x) * np.minimum(q, E4M3_MAX)).astype(np.float32)


_E4M3_TABLE = None


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    global _E4M3_TABLE
    if _E4M3_TABLE is None:
        c = np.arange(256)
        s = np.where(c & 0x80, -1.0, 1.0)
        e = (c >> 3) & 0xF
        m = c & 7
        v = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
        v = np.where((e == 15) & (m == 7), np.nan, v)
        _E4M3_TABLE = (s * v).astype(np.float32)
    return _E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(vals: np.ndarray) -> np.ndarray:
    """E4M3 values (already rounded by e4m3_round) -> codes."""
    v = np.asarray(vals, dtype=np.float32)
    table = e4m3_decode(np.arange(256, dtype=np.uint8))
    pos = np.where(np.isnan(table[:128]), np.inf, table[:128])
    idx = np.searchsorted(pos[:127], np.abs(v)).astype(np.uint8)  # table[0..126] ascending
    return np.where(np.signbit(v), idx | np.uint8(0x80), idx).astype(np.uint8)  # -0 -> 0x80 as cvt does


def roundf(x: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), exact in float32."""
    a = np.abs(x)
    f = np.floor(a)
    return np.copysign(f + (a - f >= np.float32(0.5)), x).astype(np.float32)


# --------------------------------------------------------------------------- QK-norm (rope.cu)


def head_sum_sq(x: np.ndarray) -> np.ndarray:
    """rope.cu's S(x) of head vectors x (..., hd) float32, hd a multiple of 32, bit for bit: lane l
    sums x[l]^2, x[l+32]^2, ... in order (each square rounded), then the 32-lane xor butterfly
    (offsets 16, 8, 4, 2, 1; every lane ends with the same value).  Returns (...,) float32."""
    x = np.asarray(x, dtype=np.float32)
    sq = x.reshape(*x.shape[:-1], -1, 32)
    sq = sq * sq
    acc = np.zeros(sq.shape[:-2] + (32,), np.float32)
    for i in range(sq.shape[-2]):
        acc = acc + sq[..., i, :]
    lanes = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        acc = acc + acc[..., lanes ^ o]
    return acc[..., 0]


def qk_norm_ref(x: np.ndarray, w: np.ndarray, eps: float, full: bool) -> np.ndarray:
    """rope.cu's QK-norm of q (or k) rows x (T, n, hd) float32, bit for bit: per head (QK_NORM 1,
    w (hd,)) each head by rms_inv(S(head), hd); full (QK_NORM 2, MiniMax-M2, w (n * hd,)) every
    head of row t by rms_inv(S(head 0) + ... + S(head n-1), n * hd), the heads added left to right
    from 0; then (x * inv) * w.  rms_inv(s, m) = 1 / sqrt(s / m + eps), each step rounded to
    float32 (common.cuh).  The same RMSNorm as NumpyBackend.rope_kv's up to the sums' order."""
    x = np.asarray(x, dtype=np.float32)
    T, n, hd = x.shape
    ss = head_sum_sq(x)  # (T, n)
    if full:
        tot = np.zeros(T, np.float32)
        for h in range(n):
            tot = tot + ss[:, h]
        ss, m = np.repeat(tot[:, None], n, axis=1), n * hd
    else:
        m = hd
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(m) + np.float32(eps))
    return (x * inv[..., None]) * np.asarray(w, dtype=np.float32).reshape(n if full else 1, hd)


# --------------------------------------------------------------------------- KV cache


def kv_cache_nbytes(kv_type: str, n_ctx: int, n_kv: int, head_dim: int) -> int:
    n = n_ctx * n_kv * head_dim
    if kv_type == "bf16":
        return 2 * n
    if kv_type == "q8_0":
        assert head_dim % 32 == 0
        return n + n // 16
    if kv_type == "fp8":
        return n + 4 * n_ctx * n_kv
    if kv_type == "f32":
        return 4 * n
    raise ValueError(f"unknown kv cache type {kv_type!r}")


def kv_cache_shape(kv_type: str, n_ctx: int, n_kv: int, head_dim: int) -> tuple[tuple, type]:
    """(shape, dtype) of a cache buffer: (N, K, row units) so that N and K read off the shape;
    for q8_0 / fp8 the row unit is bytes and the bytes are planar (see the module docstring)."""
    per_row = kv_cache_nbytes(kv_type, 1, 1, head_dim)
    if kv_type == "bf16":
        return (n_ctx, n_kv, head_dim), np.uint16
    if kv_type == "f32":
        return (n_ctx, n_kv, head_dim), np.float32
    return (n_ctx, n_kv, per_row), np.uint8


def kv_quantize(x: np.ndarray, kv_type: str):
    """x: (..., hd) float32 head vectors -> (codes, scales) as stored.
    bf16: (uint16 bits, None); q8_0: (int8 (..., hd), f16 (..., hd/32)); fp8: (uint8, f32 (...,));
    f32: (float32 copy, None)."""
    x = np.asarray(x, dtype=np.float32)
    if kv_type == "bf16":
        return bf16_round_bits(x), None
    if kv_type == "f32":
        return x.copy(), None
    hd = x.shape[-1]
    if kv_type == "q8_0":
        blocks = x.reshape(*x.shape[:-1], hd // 32, 32)
        d = np.max(np.abs(blocks), axis=-1, keepdims=True) / np.float32(127.0)
        with np.errstate(divide="ignore"):
            idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
        q = roundf(blocks * idv).astype(np.int8).reshape(x.shape)
        return q, d[..., 0].astype(np.float16)
    if kv_type == "fp8":
        d = (np.max(np.abs(x), axis=-1) / np.float32(E4M3_MAX)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(d[..., None] > 0, x / d[..., None], np.float32(0.0))
        return e4m3_encode(e4m3_round(y)), d
    raise ValueError(kv_type)


def kv_dequantize(codes: np.ndarray, scales, kv_type: str) -> np.ndarray:
    """Inverse of kv_quantize: the float32 values every kernel computes with."""
    if kv_type == "bf16":
        return bf16_bits_to_f32(codes)
    if kv_type == "f32":
        return np.asarray(codes, dtype=np.float32)
    if kv_type == "q8_0":
        hd = codes.shape[-1]
        b = codes.astype(np.float32).reshape(*codes.shape[:-1], hd // 32, 32)
        return (b * scales.astype(np.float32)[..., None]).reshape(codes.shape)
    if kv_type == "fp8":
        return e4m3_decode(codes) * scales.astype(np.float32)[..., None]
    raise ValueError(kv_type)


def kv_cache_pack(codes: np.ndarray, scales, kv_type: str) -> np.ndarray:
    """(codes (N, K, hd), scales) -> the host image of the device cache buffer (kv_cache_shape)."""
    if kv_type == "bf16":
        return np.ascontiguousarray(codes, dtype=np.uint16)
    if kv_type == "f32":
        return np.ascontiguousarray(codes, dtype=np.float32)
    n, k, hd = codes.shape
    flat = np.concatenate([np.ascontiguousarray(codes).view(np.uint8).reshape(-1),
                           np.ascontiguousarray(scales).view(np.uint8).reshape(-1)])
    return flat.reshape(kv_cache_shape(kv_type, n, k, hd)[0])


def kv_cache_unpack(buf: np.ndarray, kv_type: str, n_ctx: int, n_kv: int, hd: int):
    """The device cache buffer (as host bytes) -> (codes (N, K, hd), scales)."""
    if kv_type == "bf16":
        return np.asarray(buf, dtype=np.uint16).reshape(n_ctx, n_kv, hd), None
    if kv_type == "f32":
        return np.asarray(buf).view(np.float32).reshape(n_ctx, n_kv, hd), None
    b = np.asarray(buf).view(np.uint8).reshape(-1)
    n = n_ctx * n_kv * hd
    if kv_type == "q8_0":
        return b[:n].view(np.int8).reshape(n_ctx, n_kv, hd), b[n:n + n // 16].view(np.float16).reshape(n_ctx, n_kv, hd // 32)
    return b[:n].reshape(n_ctx, n_kv, hd), b[n:n + 4 * n_ctx * n_kv].view(np.float32).reshape(n_ctx, n_kv)


def kv_cache_values(buf: np.ndarray, kv_type: str, n_ctx: int, n_kv: int, hd: int) -> np.ndarray:
    """The float32 (N, K, hd) values a device cache buffer stores."""
    return kv_dequantize(*kv_cache_unpack(buf, kv_type, n_ctx, n_kv, hd), kv_type)


# --------------------------------------------------------------------------- paged pool


def paged_rows(table: np.ndarray, positions: np.ndarray, page: int) -> np.ndarray:
    """The cache rows of ``positions`` in a paged pool of ``page``-position blocks through a
    sequence's block table (kv_pages.py; attention_common.cuh KV_PAGE, rope.cu cache_rows):
    position p is row table[p // page] * page + p % page."""
    p = np.asarray(positions, np.int64)
    table = np.asarray(table, np.int64)
    if len(p) and p.max() >= len(table) * page:
        raise ValueError(f"position {p.max()} beyond the table's {len(table)} blocks of {page}")
    return table[p // page] * page + p % page


def paged_row(table, position: int, page: int) -> int:
    """paged_rows of one position, in Python ints: a decode row's cache row, which the batched
    step computes on the host every step (NumPy's per-call cost would be most of it)."""
    b = position // page
    if not 0 <= b < len(table):
        raise ValueError(f"position {position} beyond the table's {len(table)} blocks of {page}")
    return int(table[b]) * page + position % page


def kv_cache_gather(buf: np.ndarray, kv_type: str, n_rows: int, n_kv: int, hd: int, rows: np.ndarray) -> np.ndarray:
    """The contiguous cache buffer (kv_cache_pack's layout, len(rows) positions) that holds rows
    ``rows`` of the pool buffer ``buf`` (n_rows rows): what a paged attention reads equals the
    plain kernels' operand over this buffer, bit for bit."""
    codes, scales = kv_cache_unpack(buf, kv_type, n_rows, n_kv, hd)
    rows = np.asarray(rows, np.int64)
    return kv_cache_pack(codes[rows], None if scales is None else scales[rows], kv_type)


# --------------------------------------------------------------------------- attention

DECODE_TILE = 32  # keys per decode tile (attention_decode.cu TK; attention_decode_tc.cu TCK = 64)


def decode_splits(length: int, max_splits: int, tile: int = DECODE_TILE) -> tuple[int, int]:
    """(number of splits, keys per split) for a decode row attending ``length`` keys
    (attention_merge.cuh decode_split_plan).

    Depends only on the row's own length and the static max_splits, never on how many rows
    are in the launch: that is what keeps decode and speculative verify bit-identical."""
    tiles = -(-length // tile)
    per = max(1, -(-tiles // max_splits))
    return -(-tiles // per), per * tile


def attention_ref(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, positions: np.ndarray, scale: float,
                  dtype=np.float64) -> np.ndarray:
    """Causal GQA attention in ``dtype``: q (T, H, hd) at ``positions`` (T,), keys/vals (S, K, hd)
    as stored; row t attends keys 0..positions[t].  Returns (T, H, hd)."""
    T, H, hd = q.shape
    K = keys.shape[1]
    G = H // K
    qd, kd, vd = (np.asarray(a, dtype=dtype) for a in (q, keys, vals))
    out = np.empty((T, H, hd), dtype)
    for t in range(T):
        n = int(positions[t]) + 1
        for h in range(H):
            s = kd[:n, h // G] @ qd[t, h] * dtype(scale)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vd[:n, h // G]
    return out


def bf16x2_split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 x -> (hi, lo) float32 values of bf16 numbers, hi = bf16(x), lo = bf16(x - hi)
    (x - hi is exact in float32): x - (hi + lo) is within 2^-17 |x| (the prefill attention's Q and P)."""
    x = np.asarray(x, dtype=np.float32)
    hi = bf16_round(x)
    return hi, bf16_round((x - hi).astype(np.float32))


def _mma_operand(x: np.ndarray, operands: str) -> np.ndarray:
    """What an MMA operand of float32 x contributes: x itself, or hi + lo (bf16x2)."""
    if operands == "f32":
        return np.asarray(x, dtype=np.float32)
    if operands == "bf16x2":
        hi, lo = bf16x2_split(x)
        return hi.astype(np.float64) + lo  # exact sum (the MMAs take the products exactly)
    raise ValueError(operands)


def attention_flash_ref(q, keys, vals, positions, scale, block: int = 64, operands: str = "f32") -> np.ndarray:
    """The same contract computed the way the kernels do (float32, online softmax over key
    blocks at absolute multiples of ``block``, log-sum-exp merge), to show the blockwise
    algebra equals plain softmax attention.  ``operands`` emulates how attn_prefill feeds q and
    the probabilities p to its MMAs: "f32" (unrounded) or "bf16x2" (hi + lo, as the kernel); keys
    and values are used as given (exact bf16 in the kernel; for q8_0 / fp8 / f32 caches the kernel
    also splits K and V into hi + lo and drops only the lo.lo products; "bf16x2" here models K and
    V as exact).
    The MMA's own accumulation is modelled as float64 dot products rounded to float32."""
    T, H, hd = q.shape
    K = keys.shape[1]
    G = H // K
    out = np.empty((T, H, hd), np.float32)
    for t in range(T):
        n = int(positions[t]) + 1
        for h in range(H):
            m, l, acc = -np.inf, np.float32(0), np.zeros(hd, np.float32)
            qo = _mma_operand(q[t, h], operands)
            for b0 in range(0, n, block):
                kb = keys[b0:min(n, b0 + block), h // G]
                s = (kb.astype(np.float64) @ qo).astype(np.float32) * np.float32(scale)
                mn = max(m, float(s.max()))
                alpha = np.float32(math.exp(m - mn)) if m != -np.inf else np.float32(0)
                p = np.exp(s - np.float32(mn)).astype(np.float32)
                l = l * alpha + p.sum(dtype=np.float32)
                pv = (_mma_operand(p, operands) @ vals[b0:min(n, b0 + block), h // G].astype(np.float64))
                acc = acc * alpha + pv.astype(np.float32)
                m = mn
            out[t, h] = acc / l
    return out


# --------------------------------------------------------------------------- Philox4x64-10

_M64 = (1 << 64) - 1
_PHILOX_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
_PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)


def philox4x64_block(counter: tuple[int, int, int, int], key: tuple[int, int], rounds: int = 10) -> tuple[int, ...]:
    """One Philox4x64 block (Salmon et al. SC'11, Random123 philox4x64round)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _M64, (k1 + _PHILOX_W[1]) & _M64
        p0, p1 = _PHILOX_M[0] * c0, _PHILOX_M[1] * c2
        c0, c1, c2, c3 = ((p1 >> 64) ^ c1 ^ k0) & _M64, p1 & _M64, ((p0 >> 64) ^ c3 ^ k1) & _M64, p0 & _M64
    return c0, c1, c2, c3


def philox_first_raw(seed: int, position: int) -> int:
    """``np.random.Philox(key=[seed lo, seed hi], counter=[position, 0, 0, 0]).random_raw()``:
    NumPy increments the 256-bit counter before the first block and returns its word 0."""
    ctr = ((position & _M64) + 1) | 0  # 256-bit increment with carry
    c = [ctr & _M64, ctr >> 64, 0, 0]
    return philox4x64_block(tuple(c), (seed & _M64, (seed >> 64) & _M64))[0]


def vocab_gather_ref(gathered: np.ndarray, world: int, rows: int, V: int) -> np.ndarray:
    """collective.cu vocab_gather: the LM head's all-gathered logits ([world][rows * vc] as NCCL
    leaves them, GPU r's first rows * n_r values its logits [rows][n_r], n_r = min(vc, V - r vc),
    vc = ceil(V / world)) in vocabulary order: (rows, V)."""
    vc = -(-V // world)
    g = np.asarray(gathered, np.float32).reshape(world, rows * vc)
    return np.concatenate([g[r, :rows * max(0, min(vc, V - r * vc))].reshape(rows, -1) for r in range(world)], axis=1)
