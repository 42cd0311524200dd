"""Tensor parallelism over the GPUs of one host (``--gpus``): how each weight is split, what
each GPU holds, and where the GPUs combine their results.  Pure (shapes and sizes only, no
GPU); the NumPy reference of the sharded forward (backends/numpy_sharded.py) and the CUDA path
follow this plan.

The split is Megatron-LM's (Shoeybi et al. 2019, arXiv:1909.08053, sec. 3): in each block a
column-parallel product (every GPU computes its share of the outputs from the whole input)
feeds a row-parallel one (every GPU multiplies its share of the inputs and holds a partial sum
of the whole output), so a block's two halves cost one all-reduce each:

- attention: q / k / v by heads, each GPU whole GQA groups (its query heads and the KV heads
  they read; when there are more GPUs than KV heads each KV head is kept on the GPUs whose
  query heads read it, as vLLM does), so rope, the KV cache and attention stay local; o by
  the same heads' columns;
- dense MLP: gate / up by rows (the F hidden units), down by the same columns;
- MoE: the router replicated (every GPU picks the same experts from the same input), routed
  experts by index ranges (a token's expert runs whole on its owner), the shared expert as a
  dense MLP; each GPU adds its experts' weighted outputs in the router's ranking order, then the
  GPUs' partial sums are reduced;
- gated DeltaNet (Qwen3-Next / Qwen3.5): by key-head groups (a GPU keeps its key heads and the
  value heads that read them, in the layer's head order), so the conv, the recurrent state and
  the gated norm stay local; the out projection by the same value heads' columns;
- embedding and LM head by vocabulary ranges: the embedding's all-reduce adds one GPU's row to
  zeros (exact), the LM head's all-gather concatenates logits (no arithmetic);
- norms, the router, its selection bias and the shared expert's gate replicated.

Reduction order: every all-reduce sums the GPUs' float32 partials in rank order,
((p_0 + p_1) + p_2) + ..., the same bits on every GPU; with one GPU there is nothing to reduce
and the pass is the single-GPU pass.  The CUDA path gathers the partials (NCCL all-gather moves
bytes, never adds) and sums them in that order itself; for two GPUs an NCCL float32 sum is the
same bits (one addition, and addition commutes).

A dimension that must be shared equally (heads, KV heads, FFN width, DeltaNet key heads) and
does not divide is refused, naming it (PartitionError); vocabulary and expert ranges may be
uneven (the last GPU's shorter), as nothing is summed across them.  One GPU's plan is the same
rules with one piece each (what the reference runs to show it is the unsplit pass, bit for bit).

Shape legend: D width, H query heads, K KV heads, hd head dim, F FFN width, V vocabulary,
E routed experts, Hk / Hv DeltaNet key / value heads, N GPUs (the world).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .ops import AttentionSpec, DeltaNetSpec
from .options import OptionError

REPLICATE, ROWS, COLS, EXPERTS, VOCAB = "replicate", "rows", "cols", "experts", "vocab"


class PartitionError(OptionError):
    """A model that cannot be split over the GPUs asked for (the CLI prints it, exit code 2)."""


@dataclass(frozen=True)
class Split:
    """How one weight is shared among the GPUs.  ``kind``: REPLICATE (whole on each), ROWS (the
    output features: column-parallel), COLS (the input features: row-parallel, its product is a
    partial sum), EXPERTS (expert indices of an (E, out, in) tensor), VOCAB (rows of the
    embedding / LM head).  ``ranges[r]``: GPU r's index ranges (lo, hi) along the split axis, in
    the order they are stacked on that GPU."""

    kind: str
    ranges: tuple = ()

    def indices(self, rank: int) -> np.ndarray:
        return np.concatenate([np.arange(lo, hi) for lo, hi in self.ranges[rank]]).astype(np.int64)

    def count(self, rank: int) -> int:
        return sum(hi - lo for lo, hi in self.ranges[rank])


@dataclass(frozen=True)
class Collective:
    """One exchange between the GPUs: ``op`` "all-reduce" (float32 partial sums, added in rank
    order) or "all-gather" (pieces concatenated in rank order) of ``values`` float32 values per
    GPU and row, combining the results of ``after``."""

    op: str
    after: str
    values: int


def _even(n: int, world: int, unit: int = 1, base: int = 0) -> list[tuple]:
    """n items of ``unit`` values each, dealt in equal consecutive ranges: GPU r's ((lo, hi),)."""
    k = n // world
    return [((base + r * k * unit, base + (r + 1) * k * unit),) for r in range(world)]


def _uneven(n: int, world: int) -> list[tuple]:
    """n items in ceil(n / N)-long consecutive ranges (the last shorter; empty where n < N)."""
    k = -(-n // world)
    return [((min(r * k, n), min((r + 1) * k, n)),) for r in range(world)]


def _divisors(n: int, upto: int = 16) -> str:
    return ", ".join(str(d) for d in range(1, upto + 1) if n % d == 0)


def _require(world: int, n: int, what: str, why: str) -> None:
    if n % world:
        raise PartitionError(f"--gpus {world}: {what} = {n} does not divide over {world} GPUs ({why}); "
                             f"GPU counts that divide it: {_divisors(n)}")


def kv_heads_per_gpu(n_heads: int, n_kv: int, world: int) -> int:
    """KV heads each GPU holds: K / N, or one (replicated) where N is a multiple of K."""
    return n_kv // world if n_kv % world == 0 else 1


def _kv_ranges(n_heads: int, n_kv: int, world: int, unit: int, base: int = 0) -> list[tuple]:
    if n_kv % world == 0:
        return _even(n_kv, world, unit, base)
    per = world // n_kv  # GPUs sharing one KV head: GPU r's query heads all read head r // per
    return [((base + r // per * unit, base + (r // per + 1) * unit),) for r in range(world)]


def _heads_check(world: int, H: int, K: int) -> None:
    _require(world, H, "num_attention_heads", "each GPU computes whole query heads")
    if K % world and world % K:
        raise PartitionError(f"--gpus {world}: num_key_value_heads = {K} neither divides over {world} GPUs nor "
                             f"divides {world} (each GPU keeps whole GQA groups); GPU counts that work: "
                             f"{', '.join(str(d) for d in range(1, 17) if (K % d == 0 or d % K == 0) and H % d == 0)}")


def local_attention(spec: AttentionSpec, world: int) -> AttentionSpec:
    """The attention one GPU computes: its H / N query heads and the KV heads they read."""
    if world == 1:
        return spec
    return dataclasses.replace(spec, n_heads=spec.n_heads // world,
                               n_kv_heads=kv_heads_per_gpu(spec.n_heads, spec.n_kv_heads, world))


def local_deltanet(spec: DeltaNetSpec, world: int) -> DeltaNetSpec:
    """The gated DeltaNet one GPU computes: Hk / N key heads, the Hv / N value heads that read
    them, in the same head order (grouped: consecutive; tiled: every Hk-th, which stays tiled
    over the GPU's own key heads)."""
    if world == 1:
        return spec
    return dataclasses.replace(spec, n_k_heads=spec.n_k_heads // world, n_v_heads=spec.n_v_heads // world)


def _deltanet_v_heads(spec: DeltaNetSpec, world: int) -> list[list[int]]:
    """GPU r's value heads, in the layer's order: those whose key head is one of its own."""
    Hk, Hv, hk = spec.n_k_heads, spec.n_v_heads, spec.n_k_heads // world
    key = (lambda j: j % Hk) if spec.v_head_order == "tiled" else (lambda j: j // (Hv // Hk))
    return [[j for j in range(Hv) if r * hk <= key(j) < (r + 1) * hk] for r in range(world)]


def _runs(ids: list[int], unit: int, base: int = 0) -> tuple:
    """Consecutive ids as ranges of ``unit`` values each, offset by ``base``."""
    out: list[list[int]] = []
    for j in ids:
        if out and out[-1][1] == base + j * unit:
            out[-1][1] += unit
        else:
            out.append([base + j * unit, base + (j + 1) * unit])
    return tuple(tuple(r) for r in out)


@dataclass
class PartitionPlan:
    """The split of every weight of a model over ``world`` GPUs (canonical tensor names, as
    ``Model.tensor_shapes`` lists them), and what it costs each GPU."""

    world: int
    splits: dict[str, Split]
    shapes: dict[str, tuple]
    heads: tuple[int, int, int]  # the model's (H, K, hd)
    deltanet: DeltaNetSpec | None
    n_kv_layers: int
    n_state_layers: int
    hidden: int
    vocab: int

    def weight_bytes(self, tensors: dict) -> list[int]:
        """Bytes of the given tensors (a Checkpoint's ``tensors`` / ``mtp``) each GPU holds: a
        share of each split tensor in proportion to its rows, columns or experts (exact where
        the split falls on whole rows and blocks, as ``partition`` requires), the whole of each
        replicated one."""
        out = [0] * self.world
        for name, t in tensors.items():
            s = self.splits[name]
            for r in range(self.world):
                if s.kind == REPLICATE:
                    out[r] += t.nbytes
                elif s.kind == EXPERTS:
                    out[r] += sum(t.expert(e).nbytes for e in s.indices(r))
                else:
                    n = t.shape[-1] if s.kind == COLS else t.shape[0]
                    out[r] += t.nbytes * s.count(r) // n
        return out

    def kv_token_bytes(self, kv_type: str) -> float:
        """One GPU's K and V bytes per position (every GPU holds the same number of KV heads)."""
        from .backends.cuda_budget import kv_token_bytes

        H, K, hd = self.heads
        return kv_token_bytes(self.n_kv_layers, kv_heads_per_gpu(H, K, self.world), hd, kv_type)

    def state_bytes(self) -> int:
        """One GPU's gated DeltaNet state per sequence (float32 conv rows and S)."""
        if not self.n_state_layers:
            return 0
        s = local_deltanet(self.deltanet, self.world)
        return 4 * self.n_state_layers * ((s.conv_kernel - 1) * s.conv_dim + s.n_v_heads * s.k_head_dim * s.v_head_dim)

    def collectives(self, layer: int) -> list[Collective]:
        """The exchanges of decoder layer ``layer``, in the order the block runs them (none with
        one GPU)."""
        if self.world == 1:
            return []
        p, out = f"blk.{layer}.", []
        if p + "attn_o" in self.splits:
            if self.splits.get(p + "attn_q_norm", Split(REPLICATE)).kind == ROWS:
                # MiniMax-M2's QK-norm spans every head: each GPU's sums of squares of its q and k
                out.append(Collective("all-reduce", "attn_q_norm/attn_k_norm", 2))
            out.append(Collective("all-reduce", "attn_o", self.hidden))
        else:
            out.append(Collective("all-reduce", "ssm_out", self.hidden))
        out.append(Collective("all-reduce", "ffn_down_exps" if p + "ffn_down_exps" in self.splits else "ffn_down",
                              self.hidden))
        return out

    def pass_collectives(self) -> list[Collective]:
        """The exchanges outside the layers: the embedding's (before layer 0) and the LM head's
        (after the final norm; each GPU's piece padded to ceil(V / N) for NCCL's equal counts)."""
        if self.world == 1:
            return []
        return [Collective("all-reduce", "tok_embd", self.hidden),
                Collective("all-gather", "output", -(-self.vocab // self.world))]


def _block_check(world: int, name: str, split: Split, fmt: str | None) -> None:
    """A row-parallel split must fall on the format's block boundaries (a GPU holds whole blocks)."""
    if fmt is None or fmt == "FP8_E4M3":  # FP8's 128x128 scale blocks: the loader dequantizes a share
        return
    from gguf.constants import GGMLQuantizationType as T

    from .quants import block_info

    bs = block_info(T[fmt])[0]
    bad = [edge for rr in split.ranges for r in rr for edge in r if edge % bs]
    if bad:
        raise PartitionError(f"--gpus {world}: {name} ({fmt}) would be split at input {bad[0]}, inside one of the "
                             f"format's {bs}-value blocks; use fewer GPUs or another weight format")


def partition(model_cls, args, world: int, formats: dict[str, str] | None = None,
              mtp_layers: int = 0) -> PartitionPlan:
    """The plan of a model family (``Model`` class of models/*.py) with ``args`` over ``world``
    GPUs; ``formats`` (a Checkpoint's ``formats()``) adds the block-boundary check of the
    row-parallel splits; ``mtp_layers`` NextN layers' tensors are planned too (models/mtp.py:
    the layer as the trunk's, eh_proj and the norms replicated, its head and embedding by
    vocabulary).  Raises PartitionError naming the dimension that does not divide."""
    if world < 1:
        raise PartitionError(f"--gpus {world}: expected one GPU or more")
    a, N = args, world
    shapes = dict(model_cls.tensor_shapes(a))
    if mtp_layers:
        shapes.update(model_cls.mtp_tensor_shapes(a, mtp_layers))
    H, K, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
    hybrid = hasattr(a, "deltanet_spec")
    attn_layers = [i for i in range(a.num_hidden_layers + mtp_layers) if not (hybrid and a.is_linear(i))]
    if attn_layers:
        _heads_check(N, H, K)
        if model_cls.qk_norm_width == "full" and K % N:  # its sum of squares would count a shared KV head twice
            raise PartitionError(f"--gpus {N}: num_key_value_heads = {K} does not divide over {N} GPUs, and the "
                                 "QK-norm over the whole k projection needs each KV head on one GPU; GPU counts "
                                 f"that work: {', '.join(str(d) for d in range(1, 17) if K % d == 0 and H % d == 0)}")
    dn = a.deltanet_spec() if hybrid else None
    if dn is not None and len(attn_layers) < a.num_hidden_layers + mtp_layers:
        _require(N, dn.n_k_heads, "linear_num_key_heads", "each GPU keeps whole key-head groups of the gated DeltaNet")

    def attn_rows(role: str, width: int) -> tuple:
        """q (H heads of ``width`` rows: hd, or 2 hd with the output gate), or k / v."""
        return tuple(_even(H, N, width)) if role == "q" else tuple(_kv_ranges(H, K, N, hd))

    def deltanet_channels() -> tuple:
        """attn_qkv rows / conv channels, q | k | v: the GPU's key heads' q and k, its value heads' v."""
        Hk, dk, dv, hk = dn.n_k_heads, dn.k_head_dim, dn.v_head_dim, dn.n_k_heads // N
        v = _deltanet_v_heads(dn, N)
        return tuple(_runs(range(r * hk, (r + 1) * hk), dk) + _runs(range(r * hk, (r + 1) * hk), dk, Hk * dk)
                     + _runs(v[r], dv, 2 * Hk * dk) for r in range(N))

    splits: dict[str, Split] = {}
    for name, (shape, _) in shapes.items():
        role = name.split(".", 2)[-1] if name.startswith("blk.") else name
        role = role.removeprefix("nextn.")
        if role in ("tok_embd", "output", "embed_tokens", "shared_head_head"):
            kind, ranges = VOCAB, tuple(_uneven(shape[0], N))
        elif role in ("attn_q", "attn_q_bias"):
            kind, ranges = ROWS, attn_rows("q", shape[0] // H)
        elif role in ("attn_k", "attn_v", "attn_k_bias", "attn_v_bias"):
            kind, ranges = ROWS, attn_rows("kv", hd)
        elif role in ("attn_q_norm", "attn_k_norm"):  # per head (hd): replicated; MiniMax-M2's full width: by heads
            full = shape[0] != hd
            kind, ranges = (ROWS, attn_rows(role[5], hd)) if full else (REPLICATE, ())
        elif role == "attn_o":
            kind, ranges = COLS, attn_rows("q", hd)
        elif role in ("attn_qkv", "ssm_conv1d"):
            kind, ranges = ROWS, deltanet_channels()
        elif role in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt", "ssm_out"):
            unit = dn.v_head_dim if role in ("attn_gate", "ssm_out") else 1
            kind = COLS if role == "ssm_out" else ROWS
            ranges = tuple(_runs(v, unit) for v in _deltanet_v_heads(dn, N))
        elif role in ("ffn_gate", "ffn_up", "ffn_gate_shexp", "ffn_up_shexp"):
            what = "intermediate_size" if role in ("ffn_gate", "ffn_up") else "the shared expert's width"
            _require(N, shape[0], what, "each GPU computes whole MLP hidden units")
            kind, ranges = ROWS, tuple(_even(shape[0], N))
        elif role in ("ffn_down", "ffn_down_shexp"):
            kind, ranges = COLS, tuple(_even(shape[1], N))
        elif role in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            if shape[0] < N:
                raise PartitionError(f"--gpus {N}: num_experts = {shape[0]} is fewer than the GPUs (each holds whole experts)")
            kind, ranges = EXPERTS, tuple(_uneven(shape[0], N))
        else:  # norms, the router and its selection bias, the shared expert's gate, ssm_norm, eh_proj
            kind, ranges = REPLICATE, ()
        splits[name] = Split(kind, ranges)
        if kind == COLS and formats is not None:
            _block_check(N, name, splits[name], formats.get(name))
    n_state = a.num_hidden_layers - sum(1 for i in attn_layers if i < a.num_hidden_layers) if hybrid else 0
    return PartitionPlan(N, splits, {k: v[0] for k, v in shapes.items()}, (H, K, hd), dn, a.num_hidden_layers - n_state,
                         n_state, a.hidden_size, a.vocab_size)


def shard_of(t, split: Split, rank: int):
    """GPU ``rank``'s piece of tensor ``t`` (a loaders.tensor QTensor, or an ExpertTensor split by
    EXPERTS) under ``split``: the tensor itself where it is replicated."""
    from .loaders.tensor import ExpertTensor

    if split.kind == REPLICATE:
        return t
    if split.kind == EXPERTS:
        (lo, hi), = split.ranges[rank]
        return ExpertTensor(t.name, t.parts[lo:hi])
    return t.take_cols(split.ranges[rank], t.name) if split.kind == COLS else t.take_rows(split.indices(rank), t.name)


def plan_for(checkpoint, world: int) -> PartitionPlan:
    """A checkpoint's plan over ``world`` GPUs, its formats' block boundaries checked."""
    from .models import get_family

    fam = get_family(checkpoint.arch)
    args = fam.ModelArgs.from_dict(checkpoint.config)
    n_mtp = len({n.split(".")[1] for n in checkpoint.mtp})
    formats = {**checkpoint.formats(), **{n: t.fmt for n, t in checkpoint.mtp.items()}}
    return partition(fam.Model, args, world, formats, n_mtp)
