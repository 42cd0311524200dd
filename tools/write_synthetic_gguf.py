"""Write a random-weight GGUF file of a synthetic shape (bw24chat/synthetic.py SHAPES) in one weight
format: the tensors ``--synthetic`` builds in memory from the same seed, byte for byte, as a file
our GGUF loader (and llama.cpp) reads, e.g. to test the expert tiers' disk tier, which reads a
memory-mapped file.  The Qwen3-30B-A3B shape is ~32 GB in Q8_0; it is written tensor by tensor and
expert by expert, so RAM holds one layer's shared arrays (synthetic.py: ~1 GB), never the file.

    PYTHONPATH=. python tools/write_synthetic_gguf.py SHAPE FORMAT PATH [--seed N] [--layers N]
    PYTHONPATH=. python tools/write_synthetic_gguf.py qwen3-30b-a3b q8_0 /scratch/qwen3-30b-a3b-q8_0.gguf

FORMAT: one of synthetic.FORMATS (bf16, q8_0, q4_k, nvfp4, ...).  Prints the write rate (fsync
included).  What differs from the in-memory model: ggml's NVFP4 blocks carry no per-tensor scale,
so an NVFP4 file holds the synthetic blocks at scale 1 (its weights are 20x the in-memory 0.05);
llama shapes are written as llama.cpp's "llama" architecture, whose Q/K rows the loader takes in
the "normal" RoPE pairing (llama.cpp's converter permutes them), not --synthetic's "neox".
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

GATING = {"softmax": 1, "sigmoid": 2}  # gguf-py ExpertGatingFuncType


def _arch(model_type: str) -> str:
    """llama.cpp's architecture name of a model family (the inverse of the loader's ARCH_FAMILY)."""
    from bw24chat.loaders.gguf_loader import ARCH_FAMILY

    return next(arch for arch, fam in ARCH_FAMILY.items() if fam == model_type and arch != "mistral")


class _Chunks:
    """The parts of one GGUF tensor's data (an expert tensor's experts), written one after the
    other: what GGUFWriter.write_tensor_data uses of an array (nbytes, tofile), without
    concatenating them in memory."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.nbytes = sum(int(a.nbytes) for a in arrays)

    def tofile(self, f) -> None:
        for a in self.arrays:
            np.ascontiguousarray(a).tofile(f)


def _parts(t) -> tuple:
    """(dtype, shape, ggml type, arrays) of a QTensor or ExpertTensor as add_tensor_info takes
    it: float tensors in their dtype and shape, the others as bytes ((E,) rows x row bytes);
    ``arrays``: the data, one array per expert."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

    from bw24chat.loaders.tensor import ExpertTensor

    experts = isinstance(t, ExpertTensor)
    raws = [p.raw for p in t.parts] if experts else [t.raw]
    if t.fmt in ("F32", "F16"):
        return raws[0].dtype, tuple(t.shape), None, raws
    bs, ts = GGML_QUANT_SIZES[T[t.fmt]]
    if t.shape[-1] % bs:  # synthetic.random_matrix fills whole blocks only: the row would be cut short
        raise ValueError(f"{t.name}: rows of {t.shape[-1]} values are no whole number of {t.fmt} blocks of {bs}")
    raws = [r.view(np.uint8) for r in raws]
    return np.dtype(np.uint8), ((len(raws),) if experts else ()) + raws[0].shape, T[t.fmt], raws


def _metadata(w, ck, args) -> None:
    import gguf
    from tokenizers import pre_tokenizers

    a = args
    w.add_name(ck.name)
    w.add_block_count(a.num_hidden_layers)
    w.add_context_length(a.max_position_embeddings)
    w.add_embedding_length(a.hidden_size)
    w.add_feed_forward_length(a.intermediate_size)
    w.add_head_count(a.num_attention_heads)
    w.add_head_count_kv(a.num_key_value_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_layer_norm_rms_eps(a.rms_norm_eps)
    w.add_rope_freq_base(a.rope_theta)
    w.add_rope_dimension_count(int(a.head_dim * a.partial_rotary_factor) // 2 * 2)
    w.add_vocab_size(a.vocab_size)
    if getattr(a, "num_experts", 0):
        w.add_expert_count(a.num_experts)
        w.add_expert_used_count(a.num_experts_per_tok)
        w.add_expert_feed_forward_length(a.moe_intermediate_size)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(GATING[a.scoring_func]))
        w.add_expert_weights_norm(a.norm_topk_prob)
        w.add_expert_weights_scale(a.routed_scaling_factor)
        if a.n_shared_experts:
            w.add_expert_shared_count(a.n_shared_experts)
        if getattr(a, "first_k_dense_replace", 0):
            w.add_leading_dense_block_count(a.first_k_dense_replace)
        if (a.n_group or 1) > 1:
            w.add_expert_group_count(a.n_group)
            w.add_expert_group_used_count(a.topk_group)
    # a byte-level vocabulary (the synthetic models' ids are random: any valid one serves)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(sorted(pre_tokenizers.ByteLevel.alphabet()))
    w.add_token_merges([])


def write_synthetic_gguf(shape: str, fmt: str, path: Path, seed: int = 0, layers: int | None = None, report=print) -> int:
    """Write ``synthetic_checkpoint(shape, fmt, seed)`` (its first ``layers`` layers if given) as a
    GGUF file at ``path``; returns its size in bytes."""
    import gguf

    from bw24chat.loaders.names import GGUF_ARCH_MAPS, GGUF_MAP
    from bw24chat.models import get_family
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    ck = synthetic_checkpoint({**SHAPES[shape], "num_hidden_layers": layers} if layers else shape, fmt.upper(), seed)
    ck.name = f"synthetic-{shape}-{fmt.lower()}" + (f"-{layers}-layers" if layers else "")
    args = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    arch = _arch(ck.arch)
    names = GGUF_ARCH_MAPS.get(arch, GGUF_MAP)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, ck, args)
    order = []
    for canon, t in ck.tensors.items():
        dtype, byte_shape, raw_dtype, arrays = _parts(t)
        data = _Chunks(arrays)
        w.add_tensor_info(names.source(canon), byte_shape, dtype, data.nbytes, raw_dtype=raw_dtype)
        order.append((canon, data))
    total = sum(d.nbytes for _, d in order)
    report(f"{path}: {ck.name}, {args.num_hidden_layers} layers, {len(order)} tensors, {total / 1e9:.2f} GB of weights")
    t0 = time.perf_counter()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done, last = 0, t0
    for canon, data in order:
        w.write_tensor_data(data)
        done += data.nbytes
        now = time.perf_counter()
        if now - last > 5:
            report(f"  {done / 1e9:6.2f} / {total / 1e9:.2f} GB, {done / 1e9 / (now - t0):.2f} GB/s")
            last = now
    f = w.fout[0]
    f.flush()
    os.fsync(f.fileno())
    w.close()
    dt = time.perf_counter() - t0
    size = path.stat().st_size
    report(f"wrote {size / 1e9:.2f} GB in {dt:.1f} s: {size / 1e9 / dt:.2f} GB/s (fsync included)")
    return size


def main(argv: list[str]) -> int:
    from bw24chat.synthetic import FORMATS, SHAPES

    p = argparse.ArgumentParser(prog="write_synthetic_gguf.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("format", choices=FORMATS)
    p.add_argument("path", type=Path)
    p.add_argument("--seed", type=int, default=0, help="synthetic_checkpoint's seed (--synthetic uses 0)")
    p.add_argument("--layers", type=int, help="only the first N layers of the shape (its layer shape, a smaller file)")
    a = p.parse_args(argv)
    write_synthetic_gguf(a.shape, a.format, a.path, a.seed, a.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
