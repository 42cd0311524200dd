"""The MTP head (models/mtp.py) on the CUDA runner's GPU: the runner's ``mtp_forward`` and
``mtp_draft`` (backends/runner.py).  The head has its own one-layer KV cache, logits, step image
and graphs; it runs the model file's head forward on ``_HeadOps`` (the op set bound to them) over
the runner's stream, its buffers and the trunk's sampler workspace.  A draft of k tokens is one
pass over the catch-up rows, then a chain of k - 1 rows on the device, each embedding the draft
the sampler just drew, with one synchronization and the drafts read back.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..api import SamplingParams
from . import cuda_ops as ops
from .cuda_opset import CudaLoader, CudaOps
from .cuda_runner import _ROW_PARAMS, RING
from .cuda_weights import DeviceWeight
from .kernel_build import tracing
from .runner import MAX_ROWS

if TYPE_CHECKING:
    from .cuda_runner import CudaRunner

# The MTP head's step image (pinned on the host, mirrored on the device; CudaMTP.draft): int32
# arrays of MAX_ROWS each (the catch-up rows' tokens, positions, lengths; the chained rows'
# positions, lengths; each draft's sampling position; the drafts, copied back), the drafts'
# sampling params and ring (one block: each draft is pushed to the ring as it is drawn), then the
# catch-up rows' trunk hidden states.  A pass of m rows copies the image up to its m rows.
_MTP_TOK, _MTP_POS, _MTP_LEN, _MTP_CPOS, _MTP_CLEN, _MTP_SPOS, _MTP_OUT = (i * MAX_ROWS for i in range(7))
_MTP_PARAMS = 256  # bytes
_MTP_RING = _MTP_PARAMS + _ROW_PARAMS
_MTP_HIDDEN = -(-(_MTP_RING + 4 * RING) // 256) * 256


class _HeadOps(CudaOps):
    """The op set for one decode pass of the MTP head (models/mtp.py): its rows' tokens,
    positions and lengths from the head's step image (``tokens``: a catch-up pass's, or the
    draft a chained row embeds), the head's one-layer KV cache (``cache``: its K and V), buffers
    of its own (the trunk's rows stay readable: last_hidden), and the LM head on the last row
    only, into ``logits`` (None: none at all, for a pass that only fills the head's cache); a head
    over a reduced vocabulary (models/mtp.py) has its n logits in a buffer of its own, expanded
    into ``logits``."""

    def __init__(self, runner: CudaRunner, rows: int, tokens, positions, lengths, cache: tuple, logits=None):
        super().__init__(runner, rows, decode=True)
        self.tokens, self.positions, self.lengths = tokens, positions, lengths
        self.cache_k, self.cache_v = [cache[0]], [cache[1]]
        self.logits = logits

    def buf(self, name: str, *cols: int, dtype: str = "f4"):
        return self.r.buffer("d:mtp." + name, self.n, *cols, dtype=dtype)

    def lm_head(self, x, W: DeviceWeight):
        if self.logits is None:
            return None
        out = self.logits if W.out == self.logits.shape[1] else self.buf("draft_logits", W.out)[:1]
        return self._lm_head_matvec(self._last_row(x), W, out, 1)

    def vocab_expand(self, logits, vmap):
        ops.vocab_expand(logits, vmap, self.logits)
        return self.logits


def load_head(runner: CudaRunner, checkpoint) -> CudaMTP | None:
    """The checkpoint's MTP head on the runner's GPU, or None.  Its weights load through a loader
    of their own, so that the runner's decode_weight_bytes stays the trunk's."""
    from ..models.mtp import load_mtp

    loader = CudaLoader()
    head = load_mtp(runner.model, loader, checkpoint.mtp)
    return None if head is None else CudaMTP(runner, head)


class CudaMTP:
    """The head (``head``: models/mtp.py MTPHead) with its own one-layer KV cache, logits, last
    row's g, step image, plans and graphs, on the runner's stream."""

    def __init__(self, runner: CudaRunner, head):
        self.r, self.head = runner, head
        cp, a = runner.cp, runner.args
        self.cache_k = ops.kv_cache_alloc(runner.kv_type, runner.n_ctx, a.num_key_value_heads, a.head_dim)
        self.cache_v = ops.kv_cache_alloc(runner.kv_type, runner.n_ctx, a.num_key_value_heads, a.head_dim)
        self.logits = cp.zeros((1, a.vocab_size), cp.float32)
        self.g = cp.zeros((1, a.hidden_size), cp.float32)  # the last row's g: what a chained row takes
        n = _MTP_HIDDEN + MAX_ROWS * 4 * a.hidden_size
        self.h_io = cp.cuda.alloc_pinned_memory(n)
        self.d_io = cp.zeros(n, cp.uint8)
        self.h_i32 = np.frombuffer(self.h_io, np.int32, _MTP_PARAMS // 4)
        i32 = self.d_io[:_MTP_PARAMS].view(cp.int32)
        self.io = {name: i32[o:o + MAX_ROWS] for name, o in (("tok", _MTP_TOK), ("pos", _MTP_POS), ("len", _MTP_LEN),
                   ("cpos", _MTP_CPOS), ("clen", _MTP_CLEN), ("spos", _MTP_SPOS), ("out", _MTP_OUT))}
        self.io.update(params=self.d_io[_MTP_PARAMS:_MTP_RING].view(cp.uint64),
                       ring=self.d_io[_MTP_RING:_MTP_RING + 4 * RING].view(cp.int32),
                       hidden=self.d_io[_MTP_HIDDEN:].view(cp.float32).reshape(MAX_ROWS, a.hidden_size))
        self.plans: dict = {}  # ("pass", rows, from_trunk, logits) / ("chain", rows) -> the traced plan
        self.graphs: dict = {}  # the same keys -> the captured plan

    def _write(self, ids, hidden, start: int, k: int, params: SamplingParams, seed: int, history) -> None:
        """The head's step image for one pass: rows ids[i] with hidden[i] at positions start + i;
        the k - 1 chained rows after the last (positions last + 1 + j); the drafts' sampling (draft
        j is the token at position last + 2 + j, drawn after ``history`` + the drafts before it)."""
        h, m = self.h_i32, len(ids)
        last = start + m - 1
        h[_MTP_TOK:_MTP_TOK + m] = ids
        h[_MTP_POS:_MTP_POS + m] = np.arange(start, start + m)
        h[_MTP_LEN:_MTP_LEN + m] = np.arange(start + 1, start + m + 1)
        h[_MTP_CPOS:_MTP_CPOS + k - 1] = np.arange(last + 1, last + k)
        h[_MTP_CLEN:_MTP_CLEN + k - 1] = np.arange(last + 2, last + k + 1)
        h[_MTP_SPOS:_MTP_SPOS + k] = np.arange(last + 2, last + k + 2)
        n_hist = min(params.repeat_last_n, RING) if params.repeat_penalty != 1.0 else 0
        recent = [int(t) for t in history[-n_hist:]] if n_hist else []
        np.frombuffer(self.h_io, np.uint64, ops.SAMPLE_PARAM_WORDS, _MTP_PARAMS)[:] = \
            ops.pack_sampling_params(params, seed, len(recent), push=True)
        if recent:
            np.frombuffer(self.h_io, np.int32, len(recent), _MTP_RING)[:] = recent
        D = self.r.args.hidden_size
        np.frombuffer(self.h_io, np.float32, m * D, _MTP_HIDDEN)[:] = np.asarray(hidden, np.float32).reshape(-1)

    def _copy(self, dst: int, src: int, nbytes: int, kind: int):
        """A copy on the runner's stream as an entry of a head plan (a memcpy node when captured)."""
        return partial(self.r.cp.cuda.runtime.memcpyAsync, dst, src, nbytes, kind, self.r.stream.ptr)

    def _ops(self, rows: int, tokens, positions, lengths, logits: bool) -> _HeadOps:
        return _HeadOps(self.r, rows, tokens, positions, lengths, (self.cache_k, self.cache_v),
                        self.logits if logits else None)

    def _pass(self, plan: list, m: int, from_trunk: bool, logits: bool) -> None:
        """Trace one head pass over the image's m catch-up rows into ``plan``: H2D image -> the
        head -> the last row's g kept -> (its logits -> draft 0 -> D2H)."""
        rt, io, D = self.r.cp.cuda.runtime, self.io, self.r.args.hidden_size
        plan.append(self._copy(self.d_io.data.ptr, self.h_io.ptr, _MTP_HIDDEN + m * 4 * D, rt.memcpyHostToDevice))
        hops = self._ops(m, io["tok"][:m], io["pos"][:m], io["len"][:m], logits)
        out, g = self.head.forward(hops, hops.tokens, io["hidden"][:m], from_trunk)
        g = hops._value(g)  # (a deferred norm where the head chains its normed output: Qwen3-Next)
        plan.append(self._copy(self.g.data.ptr, g[m - 1].data.ptr, 4 * D, rt.memcpyDeviceToDevice))
        if logits:
            self._sample(out, 0)
            plan.append(self._copy(self.h_io.ptr + 4 * _MTP_OUT, io["out"].data.ptr, 4, rt.memcpyDeviceToHost))

    def _chain(self, plan: list, n: int) -> None:
        """Trace n chained head rows after a pass into ``plan``: row j embeds draft j (the
        sampler's output, on the device), takes the previous row's g and draws draft j + 1; then
        D2H of the n + 1 drafts."""
        rt, io, D = self.r.cp.cuda.runtime, self.io, self.r.args.hidden_size
        for j in range(n):
            hops = self._ops(1, io["out"][j:j + 1], io["cpos"][j:j + 1], io["clen"][j:j + 1], True)
            out, g = self.head.forward(hops, hops.tokens, self.g, False)
            g = hops._value(g)
            plan.append(self._copy(self.g.data.ptr, g[0].data.ptr, 4 * D, rt.memcpyDeviceToDevice))
            self._sample(out, j + 1)
        plan.append(self._copy(self.h_io.ptr + 4 * _MTP_OUT, io["out"].data.ptr, 4 * (n + 1), rt.memcpyDeviceToHost))

    def _sample(self, logits, j: int) -> None:
        io = self.io
        ops.sample(logits[0], io["params"], io["out"][j:j + 1], io["ring"], io["spos"][j:j + 1], self.r.sample_ws)

    def plan(self, key: tuple) -> list:
        """The launches and copies of a head pass (key ("pass", rows, from_trunk, logits)) or of a
        chain (("chain", rows)), traced once (kernel_build.tracing) like the decode step's plan."""
        p = self.plans.get(key)
        if p is None:
            with self.r.stream, tracing() as p:
                if key[0] == "pass":
                    self._pass(p, *key[1:])
                else:
                    self._chain(p, *key[1:])
            self.plans[key] = p
        return p

    def _run(self, key: tuple) -> None:
        """Walk a head plan on the runner's stream: its graph (captured at the first use), or eagerly."""
        plan, stream = self.plan(key), self.r.stream
        with stream:
            if not self.r.use_graph:
                for item in plan:
                    item()
                return
            graph = self.graphs.get(key)
            if graph is None:
                stream.begin_capture()
                try:
                    for item in plan:
                        item()
                finally:
                    graph = self.graphs[key] = stream.end_capture()
            graph.launch(stream)

    def _rows(self, ids, hidden, start: int, from_trunk: bool, k: int, params: SamplingParams, seed: int,
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
            self._write(rows, hidden[s:s + m], start + s, k, params, seed, history)
            self._run(("pass", m, from_trunk, last))
            if not last:
                self.r.stream.synchronize()  # the next pass rewrites the image
        if k > 1:
            self._run(("chain", k - 1))
        self.r.stream.synchronize()

    def forward(self, ids, hidden, start: int, from_trunk: bool) -> tuple[np.ndarray, np.ndarray]:
        """The runner's mtp_forward: the head over rows pairing ``ids`` with ``hidden`` (host, (T, D))
        at positions start.. in its own KV cache: host copies of (logits (V,), g (D,)) of the last row."""
        self._rows(ids, hidden, start, from_trunk, 1, SamplingParams(temperature=0), 0, [])
        return self.r.cp.asnumpy(self.logits[0]), self.r.cp.asnumpy(self.g[0])

    def draft(self, ids, hidden, start: int, k: int, params: SamplingParams | None, seed: int, history) -> list[int]:
        """The runner's mtp_draft: k drafts, the catch-up rows (ids[i] with the trunk's hidden[i] at
        start + i), then k - 1 chained rows, each draft drawn on the device as the trunk draws its
        token at that position; one synchronization, the drafts read back."""
        self._rows(ids, hidden, start, True, k, params or SamplingParams(temperature=0), seed, history)
        return [int(t) for t in self.h_i32[_MTP_OUT:_MTP_OUT + k]]
