"""Mixture-of-experts on the CUDA backend: resident expert storage, the router kernel, the decode
expert kernels and the prefill's per-expert GEMMs.  Contracts: kernels/moe_router.cu,
kernels/moe_experts.cu; references: numpy_backend.route_logits and NumpyOps.experts.

Expert storage (``ExpertStore``, one per projection and layer): one device buffer per plane
holding E expert *slots* (each slot the dense resident layout of one expert, cuda_weights.
repack_host), and a device table u64 [E, 5] of each expert's plane pointers {q, h, s, d, gscale}.
The kernels read experts only through the table, so a later VRAM / host / disk tier moves an
expert by copying its planes into some slot and rewriting its table row (``set_slot``): no kernel
changes, no recapture (the graph reads the table's contents, not its values at capture time).

Decode (graph-captured, no host access): router matvec (rmsnorm prologue) -> moe_router ->
moe_gu (rmsnorm staged in the block, SwiGLU epilogue) -> [shared expert: two dense matvecs] ->
moe_down (k dot products per output, combined in ranking order, + shared, + residual).
Prefill (eager): the router's ids come to the host; the tokens of each active expert are gathered
and run through the dense ``lin.gemm`` (gate|up, swiglu, down), scattered into Y (T, k, D), and
moe_combine adds them in ranking order.  A grouped GEMM over all experts of a chunk is the later
optimisation (issue 32).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import cuda_linear as lin
from .cuda_weights import FORMATS, DeviceWeight, fmt_id, repack_host, vpc
from .kernel_build import get_kernel
from .kernel_refs import act_q8

PLANES = ("q", "h", "s", "d", "gscale")  # the table's columns (moe_experts.cu expert_row / row_gscale)
NW = 4  # moe_experts.cu MOE_NW: warps per block
DOWN_R = 2  # moe_experts.cu MOE_R: output rows per warp of moe_down
SMEM_MAX = 227 * 1024


@dataclass
class ExpertStore:
    """One projection of a layer's routed experts on the device: plane buffers of E slots and
    the per-expert pointer table the kernels read."""
    fmt: str
    n_experts: int
    out: int
    in_: int
    planes: dict  # plane name -> CuPy array (E, ...) (slot e = expert e while all are resident)
    table: object  # CuPy uint64 [E, 5]
    host_table: np.ndarray  # its host mirror
    global_scales: list = field(default_factory=list)  # per expert (NVFP4)
    nbytes: int = 0  # all experts
    role: str = ""

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.n_experts

    def set_slot(self, e: int, ptrs: dict) -> None:
        """Point expert e at planes elsewhere (a tier's slot): ptrs plane name -> device address.
        Asynchronous on the current stream (ordered with the step that will read it)."""
        for c, name in enumerate(PLANES):
            self.host_table[e, c] = np.uint64(ptrs.get(name, 0))
        self.table[e].set(self.host_table[e])

    def weight(self, e: int) -> DeviceWeight:
        """Expert e as a dense DeviceWeight (views of its slot): the prefill's lin.gemm."""
        pl = {k: (None if v is None else v[e]) for k, v in self.planes.items()}
        gs = self.global_scales[e] if self.global_scales else 1.0
        return DeviceWeight(self.fmt, self.out, self.in_, pl["q"], pl["h"], pl["s"], pl["d"], pl["gscale"], gs,
                            self.expert_nbytes, fmt_id(self.fmt), vpc(self.fmt), role=self.role)


@dataclass
class CudaExperts:
    """A layer's routed experts (ops.Loader.load_experts on CUDA)."""
    gu: ExpertStore  # (E, 2F, D), rows gate_0, up_0, ...
    down: ExpertStore  # (E, D, F)

    @property
    def nbytes(self) -> int:
        return self.gu.nbytes + self.down.nbytes


def check_format(fmt: str, F: int, D: int) -> None:
    """Refuse what the expert kernels do not handle, by name."""
    if fmt not in FORMATS:
        raise NotImplementedError(f"MoE experts in {fmt}: no CUDA expert kernel for this format "
                                  f"(supported: {', '.join(FORMATS)})")
    unit = 32 if act_q8(fmt) else max(4, vpc(fmt))
    for name, n in (("hidden size", D), ("expert width", F)):
        if n % unit or n % vpc(fmt):
            raise NotImplementedError(f"MoE experts in {fmt}: {name} {n} is not a multiple of {unit}")


def upload_experts(parts: list, interleave_with: list | None = None, role: str = "", memo: dict | None = None) -> ExpertStore:
    """The experts ``parts`` (QTensors, one per expert; with ``interleave_with`` each interleaved
    row by row with its partner, gate|up) stacked into slots."""
    import cupy as cp

    hps = []
    for e, t in enumerate(parts):
        src = [t] if interleave_with is None else [t, interleave_with[e]]
        key = tuple(id(x.raw) for x in src) + (interleave_with is not None,)
        if memo is None or key not in memo:
            hp = repack_host(src, interleave=interleave_with is not None)
            if memo is None:
                hps.append(hp)
                continue
            memo[key] = hp
        hps.append(memo[key])
    h0 = hps[0]
    E = len(hps)
    planes, table = {}, np.zeros((E, len(PLANES)), np.uint64)
    nbytes = 0
    for c, name in enumerate(PLANES):
        arrs = [getattr(hp, name) for hp in hps]
        if arrs[0] is None:
            planes[name] = None
            continue
        dev = cp.asarray(np.ascontiguousarray(np.stack(arrs)))
        planes[name] = dev
        nbytes += dev.nbytes
        stride = dev.nbytes // E
        table[:, c] = np.uint64(dev.data.ptr) + np.arange(E, dtype=np.uint64) * np.uint64(stride)
    gs = [hp.global_scales[0] if len(set(hp.global_scales)) == 1 else hp.global_scales for hp in hps] \
        if h0.global_scales else []
    return ExpertStore(h0.fmt, E, h0.out, h0.in_, planes, cp.asarray(table), table, gs, nbytes, role)


def load_experts(gate, up, down, memo: dict | None = None) -> CudaExperts:
    """ops.Loader.load_experts: gate, up (E, F, D) and down (E, D, F) ExpertTensors."""
    E, F, D = gate.shape
    for t in (gate, up, down):
        check_format(t.fmt, F, D)
    gu = upload_experts(gate.parts, up.parts, role="experts_gu", memo=memo)
    dn = upload_experts(down.parts, role="experts_down", memo=memo)
    return CudaExperts(gu, dn)


# ----------------------------------------------------------------------------- router
def router(logits, bias, ids, w, T: int, spec) -> None:
    """moe_router over T rows of logits (T, E) f32 -> ids (T, k) int32, w (T, k) f32."""
    E, k = spec.n_experts, spec.top_k
    if E > 1024 or k > 32 or spec.n_group > 32 or E % spec.n_group or (spec.n_group > 1 and E // spec.n_group < 2):
        raise NotImplementedError(f"moe_router: E {E} <= 1024, k {k} <= 32, n_group {spec.n_group} <= 32 dividing E")
    if T <= 0:
        return
    kern = get_kernel("moe_router", "moe_router")
    kern((T,), (32,), (logits, lin._ptr(bias), ids, w, np.int32(T), np.int32(E), np.int32(k),
                       np.int32(0 if spec.scoring == "softmax" else 1), np.int32(bool(spec.norm_topk_prob)),
                       np.int32(spec.n_group), np.int32(spec.topk_group), np.float32(spec.scale)))


# ----------------------------------------------------------------------------- decode
def _defines(fmt: str) -> dict:
    return {"FMT": fmt_id(fmt), **({"ACT_Q8": 1} if act_q8(fmt) else {})}


def _padded(n: int, fmt: str) -> int:
    wt = 32 * vpc(fmt)
    return -(-n // wt) * wt


def gu_split(F: int, m: int, k: int, sms: int) -> int:
    """Experts per block of moe_gu (kper): the fewest that still give two blocks per SM at this
    row count (each block stages its row's x once, so fewer, longer blocks read less L2; the
    outputs do not depend on it: one warp per output, its chunk order fixed)."""
    pair_blocks = -(-F // NW) * m
    for kper in range(k, 0, -1):
        if k % kper == 0 and pair_blocks * (k // kper) >= 2 * sms:
            return kper
    return 1


def down_smem(fmt: str, F: int, k: int) -> int:
    return 4 * k * _padded(F, fmt)


def gu_smem(fmt: str, D: int) -> int:
    return 4 * _padded(D, fmt) + 4 * NW


def _sms() -> int:
    return lin._sm_resources()[0]


def experts_gu(ex: CudaExperts, x, ids, act, m: int, k: int, norm_w=None, eps: float = 1e-6, xb16: bool = False) -> None:
    """act (m, k, F) = swiglu(gu_{ids[t, j]} @ xin[t]), xin = rmsnorm(x) * norm_w when norm_w is
    given (the deferred rmsnorm), else x."""
    g = ex.gu
    D, F = g.in_, g.out // 2
    kper = gu_split(F, m, k, _sms())
    kern = get_kernel("moe_experts", "moe_gu", **_defines(g.fmt))
    smem = gu_smem(g.fmt, D)
    lin._ensure_smem(kern, smem)
    kern((-(-F // NW), m, k // kper), (32 * NW,),
         (g.table, x, lin._ptr(norm_w), ids, act, np.int32(D), np.int32(F), np.int32(k), np.int32(kper),
          np.int32(1 if norm_w is not None else 0), np.int32(bool(xb16)), np.float32(eps)), shared_mem=smem)


def experts_down(ex: CudaExperts, act, ids, w, shared, res, m: int, k: int, xb16: bool = False) -> None:
    """res (m, D) += sum_j w[t, j] * (down_{ids[t, j]} @ act[t, j]) (ranking order) + shared."""
    d = ex.down
    D, F = d.out, d.in_
    smem = down_smem(d.fmt, F, k)
    if smem > SMEM_MAX:
        raise NotImplementedError(f"moe_down stages k x F = {k} x {F} inputs: {smem} bytes of shared memory")
    kern = get_kernel("moe_experts", "moe_down", **_defines(d.fmt))
    lin._ensure_smem(kern, smem)
    kern((-(-D // (NW * DOWN_R)), m), (32 * NW,),
         (d.table, act, ids, w, lin._ptr(shared), res, np.int32(D), np.int32(F), np.int32(k), np.int32(bool(xb16))),
         shared_mem=smem)


# ----------------------------------------------------------------------------- prefill
def prefill_experts(ex: CudaExperts, h, ids, w, Y, T: int, k: int, precise: bool = True, act_bf16: bool = False) -> None:
    """Y (T, k, D) = each row's k expert outputs, through the dense GEMMs over the rows gathered
    per active expert (host-side grouping: prefill only, never in the captured decode step)."""
    import cupy as cp

    from . import cuda_ops as ops

    ids_h = cp.asnumpy(ids[:T])  # synchronizes: prefill is eager
    F, D = ex.gu.out // 2, ex.gu.in_
    for e in np.unique(ids_h):
        rows, slots = np.nonzero(ids_h == e)
        n = len(rows)
        rows_d = cp.asarray(rows.astype(np.int64))
        xg = cp.ascontiguousarray(h[rows_d])
        gu = cp.empty((n, 2 * F), cp.float32)
        lin.gemm(ex.gu.weight(int(e)), xg, gu, n, precise=precise, act_bf16=act_bf16)
        act = cp.empty((n, F), cp.float32)
        ops.swiglu(gu, act)
        y = cp.empty((n, D), cp.float32)
        lin.gemm(ex.down.weight(int(e)), act, y, n, precise=precise, act_bf16=act_bf16)
        Y[rows_d, cp.asarray(slots.astype(np.int64))] = y


def combine(Y, w, shared, res, T: int, k: int) -> None:
    """res (T, D) += sum_j w[t, j] * Y[t, j] (ranking order) + shared: moe_combine."""
    D = res.shape[-1]
    if T <= 0:
        return
    get_kernel("moe_experts", "moe_combine")((-(-D // 256), T), (256,),
                                             (Y, w, lin._ptr(shared), res, np.int32(T), np.int32(D), np.int32(k)))
