"""Mixture-of-experts on the CUDA backend: resident expert storage, the router kernel, the decode
expert kernels and the prefill's per-expert GEMMs.  Contracts: kernels/moe_router.cu,
kernels/moe_experts.cu; references: numpy_backend.route_logits and NumpyOps.experts.

Expert storage (``CudaExperts``, one per layer): VRAM *slots*, each one expert's image (its
gate|up and down planes in the dense resident layout, cuda_weights.repack_host, at fixed
offsets), and per projection (``ExpertStore``) a device table u64 [E, 5] of each expert's plane
pointers {q, h, s, d, gscale}.  The kernels read experts only through the tables, so the tiers
(cuda_tiers) move an expert by one copy of its image into a slot and a rewrite of its table rows:
no kernel changes, no recapture (the graph reads the tables' contents, not their values at
capture time), the same bits wherever the expert came from.

Decode (graph-captured, no host access): router matvec (rmsnorm prologue) -> moe_router ->
moe_gu (rmsnorm staged in the block, SwiGLU epilogue) -> [shared expert: two dense matvecs] ->
moe_down (k dot products per output, combined in ranking order, + shared, + residual).
Prefill (eager): the router's ids come to the host; the tokens of each active expert are gathered
and run through the dense ``lin.gemm`` (gate|up, swiglu, down), scattered into Y (T, k, D), and
moe_combine adds them in ranking order.  It is launch-bound (docs/performance.md, "What bounds
MoE decode"): a grouped GEMM over all of a chunk's experts is what it lacks.
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
ALIGN = 256  # each plane of an expert image starts on a 256-byte boundary (the kernels' 16-byte loads)


@dataclass(frozen=True)
class ImageLayout:
    """Where one projection's planes sit inside an expert's image: (name, offset, shape, dtype)
    of each plane the format has; ``end`` the first byte after them."""
    planes: tuple
    end: int


def _place(hp, start: int) -> ImageLayout:
    off, out = start, []
    for name in PLANES:
        a = getattr(hp, name)
        if a is None:
            continue
        off = -(-off // ALIGN) * ALIGN
        out.append((name, off, tuple(a.shape), a.dtype.str))
        off += a.nbytes
    return ImageLayout(tuple(out), off)


def _pinned(shape, dtype) -> np.ndarray:
    import cupy as cp

    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(cp.cuda.alloc_pinned_memory(max(n, 1)), dtype, int(np.prod(shape))).reshape(shape)


@dataclass
class ExpertStore:
    """One projection of a layer's routed experts: its planes' places inside an expert image and
    the per-expert pointer table the kernels read (u64 [E, 5], a pinned host mirror beside it)."""
    fmt: str
    n_experts: int
    out: int
    in_: int
    layout: ImageLayout
    table: object  # CuPy uint64 [E, 5]
    host_table: np.ndarray  # pinned: the copy to the device is asynchronous
    global_scales: list = field(default_factory=list)  # per expert (NVFP4)
    nbytes: int = 0  # all experts' planes
    role: str = ""

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.n_experts

    def point(self, e: int, base: int) -> None:
        """Expert e's table row at the image at device address ``base`` (0: not resident; the
        host mirror only: CudaExperts.sync_tables sends it)."""
        for name, off, _shape, _dt in self.layout.planes:
            self.host_table[e, PLANES.index(name)] = np.uint64(base + off if base else 0)

    def weight(self, e: int, image) -> DeviceWeight:
        """Expert e as a dense DeviceWeight over ``image`` (the u8 device bytes of its slot): the
        prefill's lin.gemm."""
        pl = dict.fromkeys(PLANES)
        for name, off, shape, dt in self.layout.planes:
            n = int(np.prod(shape)) * np.dtype(dt).itemsize
            pl[name] = image[off:off + n].view(np.dtype(dt)).reshape(shape)
        gs = self.global_scales[e] if self.global_scales else 1.0
        return DeviceWeight(self.fmt, self.out, self.in_, pl["q"], pl["h"], pl["s"], pl["d"], pl["gscale"], gs,
                            self.expert_nbytes, fmt_id(self.fmt), vpc(self.fmt), role=self.role)


@dataclass
class CudaExperts:
    """A layer's routed experts (ops.Loader.load_experts on CUDA): VRAM slots of expert images
    (gate|up and down planes of one expert together, one copy moves an expert), the two
    projections' pointer tables, and where each expert's image comes from.  All experts resident:
    slot e holds expert e.  Spilled (cuda_tiers): fewer slots, filled as the router asks."""
    gu: ExpertStore  # (E, 2F, D), rows gate_0, up_0, ...
    down: ExpertStore  # (E, D, F)
    slab: object  # CuPy uint8 (slots, image_bytes)
    image_bytes: int
    source: "ExpertSource"
    slot_of: dict = field(default_factory=dict)  # resident expert -> slot
    layer: int = 0  # among the model's MoE layers
    tiers: object = None  # cuda_tiers.CudaTiers when the experts are spilled

    @property
    def nbytes(self) -> int:
        return self.gu.nbytes + self.down.nbytes

    @property
    def n_experts(self) -> int:
        return self.gu.n_experts

    def slot_ptr(self, slot: int) -> int:
        return int(self.slab.data.ptr) + slot * self.slab.shape[1]

    def place(self, e: int, slot: int) -> None:
        self.slot_of[e] = slot
        for st in (self.gu, self.down):
            st.point(e, self.slot_ptr(slot))

    def evict(self, e: int) -> None:
        self.slot_of.pop(e, None)
        for st in (self.gu, self.down):
            st.point(e, 0)

    def sync_tables(self, stream) -> None:
        """Send both tables' host mirrors to the device, on ``stream``."""
        import cupy as cp

        rt = cp.cuda.runtime
        for st in (self.gu, self.down):
            rt.memcpyAsync(st.table.data.ptr, st.host_table.ctypes.data, st.host_table.nbytes,
                           rt.memcpyHostToDevice, stream.ptr)

    def weights(self, e: int, image=None) -> tuple[DeviceWeight, DeviceWeight]:
        """(gate|up, down) of expert e over ``image`` (default: its resident slot)."""
        if image is None:
            image = self.slab[self.slot_of[e]]
        return self.gu.weight(e, image), self.down.weight(e, image)


class ExpertSource:
    """Builds expert images on the host from the checkpoint's expert tensors (views into the
    model file, or arrays): the repacked resident planes at their ImageLayout places."""

    def __init__(self, gate, up, down, gu_layout: ImageLayout, down_layout: ImageLayout, image_bytes: int,
                 memo: dict | None = None):
        self.gate, self.up, self.down = gate.parts, up.parts, down.parts
        self.layouts, self.image_bytes, self.memo = (gu_layout, down_layout), image_bytes, memo

    def planes(self, e: int):
        """(gate|up HostPlanes, down HostPlanes) of expert e (memoized on the source arrays:
        random-weight models share arrays across layers)."""
        out = []
        for src, inter in (([self.gate[e], self.up[e]], True), ([self.down[e]], False)):
            key = tuple(id(x.raw) for x in src) + (inter,)
            hp = self.memo.get(key) if self.memo is not None else None
            if hp is None:
                hp = repack_host(src, interleave=inter)
                if self.memo is not None:
                    self.memo[key] = hp
            out.append(hp)
        return out

    def image(self, e: int, out: np.ndarray | None = None) -> np.ndarray:
        """Expert e's image (u8 [image_bytes]) written into ``out`` (e.g. a pinned buffer)."""
        if out is None:
            out = np.zeros(self.image_bytes, np.uint8)
        for hp, lay in zip(self.planes(e), self.layouts):
            for name, off, _shape, _dt in lay.planes:
                a = getattr(hp, name)
                out[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        return out


def check_format(fmt: str, F: int, D: int) -> None:
    """Refuse what the expert kernels do not handle, by name."""
    if fmt not in FORMATS:
        raise NotImplementedError(f"MoE experts in {fmt}: no CUDA expert kernel for this format "
                                  f"(supported: {', '.join(FORMATS)})")
    unit = 32 if act_q8(fmt) else max(4, vpc(fmt))
    for name, n in (("hidden size", D), ("expert width", F)):
        if n % unit or n % vpc(fmt):
            raise NotImplementedError(f"MoE experts in {fmt}: {name} {n} is not a multiple of {unit}")


def load_experts(gate, up, down, memo: dict | None = None, slots: int | None = None) -> CudaExperts:
    """ops.Loader.load_experts: gate, up (E, F, D) and down (E, D, F) ExpertTensors, into
    ``slots`` VRAM slots (default all E: every expert resident) holding experts 0 .. slots-1."""
    import cupy as cp

    E, F, D = gate.shape
    for t in (gate, up, down):
        check_format(t.fmt, F, D)
    probe = ExpertSource(gate, up, down, None, None, 0, memo)
    hp_gu, hp_dn = probe.planes(0)
    gu_lay = _place(hp_gu, 0)
    dn_lay = _place(hp_dn, gu_lay.end)
    image_bytes = -(-dn_lay.end // ALIGN) * ALIGN
    src = ExpertSource(gate, up, down, gu_lay, dn_lay, image_bytes, memo)
    S = E if slots is None else slots
    slab = cp.empty((S, image_bytes), cp.uint8)
    stores = []
    for hp, lay, role in ((hp_gu, gu_lay, "experts_gu"), (hp_dn, dn_lay, "experts_down")):
        host_table = _pinned((E, len(PLANES)), np.uint64)
        host_table[:] = 0
        gs = []
        if hp.global_scales:  # NVFP4: each expert's per-tensor scales (the prefill GEMM's)
            parts = (gate.parts, up.parts) if role == "experts_gu" else (down.parts,)
            for e in range(E):
                scales = [float(p[e].global_scale) for p in parts]
                gs.append(scales[0] if len(set(scales)) == 1 else tuple(scales))
        nbytes = E * sum(int(np.prod(sh)) * np.dtype(dt).itemsize for _, _, sh, dt in lay.planes)
        stores.append(ExpertStore(hp.fmt, E, hp.out, hp.in_, lay, cp.zeros((E, len(PLANES)), cp.uint64), host_table,
                                  gs, nbytes, role))
    ex = CudaExperts(stores[0], stores[1], slab, image_bytes, src)
    stage = np.zeros(image_bytes, np.uint8)
    for e in range(S):
        slab[e].set(src.image(e, stage))
        ex.place(e, e)
    ex.sync_tables(cp.cuda.get_current_stream())
    cp.cuda.get_current_stream().synchronize()  # the staging array and host tables are reused
    return ex


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
    order = [int(e) for e in np.unique(ids_h)]
    # spilled experts stream through staging slots, the next copy overlapping this GEMM (cuda_tiers)
    experts = ex.tiers.stream(ex, order) if ex.tiers is not None else ((e, *ex.weights(e)) for e in order)
    for e, W_gu, W_down in experts:
        rows, slots = np.nonzero(ids_h == e)
        n = len(rows)
        rows_d = cp.asarray(rows.astype(np.int64))
        xg = cp.ascontiguousarray(h[rows_d])
        gu = cp.empty((n, 2 * F), cp.float32)
        lin.gemm(W_gu, xg, gu, n, precise=precise, act_bf16=act_bf16)
        act = cp.empty((n, F), cp.float32)
        ops.swiglu(gu, act)
        y = cp.empty((n, D), cp.float32)
        lin.gemm(W_down, act, y, n, precise=precise, act_bf16=act_bf16)
        Y[rows_d, cp.asarray(slots.astype(np.int64))] = y


def combine(Y, w, shared, res, T: int, k: int) -> None:
    """res (T, D) += sum_j w[t, j] * Y[t, j] (ranking order) + shared: moe_combine."""
    D = res.shape[-1]
    if T <= 0:
        return
    get_kernel("moe_experts", "moe_combine")((-(-D // 256), T), (256,),
                                             (Y, w, lin._ptr(shared), res, np.int32(T), np.int32(D), np.int32(k)))
