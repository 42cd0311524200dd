"""MoE experts spilled from VRAM on the CUDA backend: the tiers of expert_tiers.py at work.

Each MoE layer keeps ``slots`` expert images in VRAM (cuda_moe.CudaExperts), chosen by the slot
cache (expert_cache.py, frequency with aging); the experts ``0 .. host_experts - 1`` of each
layer wait in pinned host RAM as ready images, the rest are read from the model file on demand
(the memory-mapped GGUF / safetensors views, through the page cache) as the file holds them, and
repacked into their slot on the GPU (kernels/repack.cu: the host's NumPy repack took 1-64 ms an
expert, more than the disk read it follows).

Decode: the step's plan (CudaRunner.plan) holds one host step per MoE layer, after its router:
the host copies the router's ids back (one small copy, one synchronization), the cache decides the
misses, and each miss is one copy of its image into the slot the cache gave it, on the copy
stream, followed by the tables' rows; the compute stream waits for that copy before the layer's
expert kernels.  The kernels, their inputs and their order are those of the resident step, so a
spilled run gives the resident run's tokens bit for bit.  A pass holds at most slots // top_k
rows, so one pass's experts never evict each other (the runner splits longer steps; rows are
row-invariant).

Prefill: a chunk routes to most experts of a layer.  The resident ones run from their slots in
one pass of the grouped GEMMs; the others stream through two staging slots, each run by itself
through the same kernels (per layer and slot, tables whose every row points at the slot), the
copy of the next overlapping the GEMMs of this one; the slot cache is left as decode left it.

Bound (decode): bytes missed per token / the host-to-device copy rate (pinned: ~50 GB/s on PCIe
5.0 x16), or the disk's read rate for experts served from the file; plus one synchronization
per MoE layer (~10-20 us).  ``expert_stats`` reports hits per tier and bytes moved per token.
"""
from __future__ import annotations

import numpy as np

from .cuda_moe import CudaExperts, _pinned
from .cuda_weights import fmt_id
from .expert_tiers import ExpertTiers
from .kernel_build import get_kernel

HOST_STAGING = 4  # pinned buffers the file-served images are built in (each reused once its copy is done)


class CudaTiers:
    """The tiers of one CUDA runner: the copy stream, the pinned host tier and staging, and the
    host steps of the decode plan and the prefill's expert stream."""

    def __init__(self, tiers: ExpertTiers, top_k: int, max_rows: int):
        import cupy as cp

        self.cp, self.tiers, self.top_k = cp, tiers, top_k
        self.copy = cp.cuda.Stream(non_blocking=True)
        self.h_ids = _pinned((max_rows * top_k,), np.int32)
        self.layers: list[CudaExperts] = []
        self.host: list = []  # per layer: pinned (host_experts, image_bytes) images
        self._staging: list = []  # (pinned image buffer, event of its last copy or None)
        self._next_stage = 0
        self._dev_stage = None  # two device slots for the prefill's stream
        self._dev_raw = None  # a file-served expert's bytes on the device, repacked into its slot (copy stream)
        self._dev_free: list = [None, None]  # events: the prefill GEMMs done with each slot
        self._stage_tabs: dict = {}  # layer -> (staging address, [per slot: (gate|up table, down table)])

    # ------------------------------------------------------------------ loading
    def load(self, ex: CudaExperts) -> None:
        """Register a layer's experts (loaded into its VRAM slots, experts 0 .. slots-1) and fill
        its pinned host tier (each image repacked on the GPU, in a staging slot, and copied back)."""
        ex.layer, ex.tiers = len(self.layers), self
        self.layers.append(ex)
        raw = ex.source.raw_bytes
        if len(self._staging) < HOST_STAGING or self._staging[0][0].nbytes < raw:
            self._staging = [(_pinned((raw,), np.uint8), None) for _ in range(HOST_STAGING)]
        if self._dev_raw is None or self._dev_raw.size < raw:
            self._dev_raw = self.cp.empty(raw, self.cp.uint8)
        if self._dev_stage is None or self._dev_stage.shape[1] < ex.image_bytes:
            self._dev_stage = self.cp.empty((2, ex.image_bytes), self.cp.uint8)
        for t in ex.source.parts(0):  # the file tier's repack kernels compiled now, not at its first miss
            get_kernel("repack", "repack_blocks", FMT=fmt_id(t.fmt))
        n_host = self.tiers.plan.host_experts[ex.layer]
        imgs = _pinned((n_host, ex.image_bytes), np.uint8) if n_host else None
        self.host.append(imgs)
        for e in range(n_host):
            self._copy_in(ex, e, int(self._dev_stage[0].data.ptr), from_host=False)
            self._dev_stage[0, :ex.image_bytes].get(stream=self.copy, out=imgs[e])
        self.copy.synchronize()

    def _copy_in(self, ex: CudaExperts, e: int, dst: int, from_host: bool = True) -> None:
        """Expert e's image into device address ``dst`` on the copy stream: the pinned host tier's
        copy, or (from_host=False: always) the file's bytes through the next free staging buffer,
        repacked on the GPU."""
        rt = self.cp.cuda.runtime
        imgs = self.host[ex.layer]
        if from_host and imgs is not None and e < len(imgs):
            rt.memcpyAsync(dst, imgs[e].ctypes.data, ex.image_bytes, rt.memcpyHostToDevice, self.copy.ptr)
            return
        i = self._next_stage
        self._next_stage = (i + 1) % len(self._staging)
        buf, done = self._staging[i]
        if done is not None:
            done.synchronize()  # its previous copy has left the buffer
        ex.source.raw_into(e, buf)
        raw = int(self._dev_raw.data.ptr)
        rt.memcpyAsync(raw, buf.ctypes.data, ex.source.raw_bytes, rt.memcpyHostToDevice, self.copy.ptr)
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.copy)
        self._staging[i] = (buf, ev)
        with self.copy:  # after the copy above; the next expert's copy into _dev_raw waits for it
            ex.source.repack_on_device(e, raw, dst)

    # ------------------------------------------------------------------ decode
    def fetch(self, ex: CudaExperts, ids, m: int, stream) -> None:
        """The decode plan's host step after layer ``ex``'s router wrote ``ids`` (m, k) on
        ``stream``: bring the routed experts into VRAM slots before the expert kernels run."""
        rt = self.cp.cuda.runtime
        n = m * self.top_k
        rt.memcpyAsync(self.h_ids.ctypes.data, ids.data.ptr, 4 * n, rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        loads = self.tiers.route(ex.layer, self.h_ids[:n], m)
        if not loads:
            return
        for e, slot, evicted in loads:
            if evicted >= 0:
                ex.evict(evicted)
            self._copy_in(ex, e, ex.slot_ptr(slot))
            ex.place(e, slot)
        ex.sync_tables(self.copy)
        done = self.cp.cuda.Event(disable_timing=True)
        done.record(self.copy)
        stream.wait_event(done)

    # ------------------------------------------------------------------ prefill
    def _stage_tables(self, ex: CudaExperts) -> list:
        """Per staging slot, layer ``ex``'s (gate|up, down) device tables [E, 5] whose every row
        points at that slot (its planes' places are the layer's: one copy serves any expert);
        built once per layer and staging allocation."""
        key = (int(self._dev_stage.data.ptr), self._dev_stage.shape[1])
        have = self._stage_tabs.get(ex.layer)
        if have is None or have[0] != key:
            tabs = [tuple(self.cp.asarray(np.tile(st.row(key[0] + s * key[1]), (st.n_experts, 1)))
                          for st in (ex.gu, ex.down)) for s in range(2)]
            have = self._stage_tabs[ex.layer] = (key, tabs)
        return have[1]

    def stream(self, ex: CudaExperts, order: list[int]):
        """(expert, gate|up table, down table) for each expert of ``order`` not resident, its
        image copied into one of the two device staging slots and the tables those of the slot
        (the next copy is issued before this one is handed out, so it overlaps the caller's
        GEMMs; the caller's work on the slot is queued before the generator resumes).  Counts
        the lookups of the whole order (the resident experts are the caller's first pass)."""
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        self.tiers.lookup(ex.layer, order, set(ex.slot_of))
        rest = [e for e in order if e not in ex.slot_of]
        tabs = self._stage_tables(ex) if rest else None

        def issue(j: int):
            s = j % 2
            if self._dev_free[s] is not None:
                self.copy.wait_event(self._dev_free[s])
            self._copy_in(ex, rest[j], int(self._dev_stage[s].data.ptr))
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(self.copy)
            return ev

        ready = issue(0) if rest else None
        for j, e in enumerate(rest):
            cur = ready
            if j + 1 < len(rest):
                ready = issue(j + 1)
            stream.wait_event(cur)
            yield (e, *tabs[j % 2])
            free = cp.cuda.Event(disable_timing=True)
            free.record(stream)  # after the caller's GEMMs on this slot were enqueued
            self._dev_free[j % 2] = free
