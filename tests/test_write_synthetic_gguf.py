"""tools/write_synthetic_gguf.py: the GGUF file of a synthetic shape loads back through our GGUF
loader with the in-memory synthetic model's tensors, byte for byte, and the NumPy backend gives
the same logits from either."""
import dataclasses

import numpy as np
import pytest

from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.loaders import load_checkpoint
from bw24chat.models import get_family
from bw24chat.synthetic import synthetic_checkpoint
from tools.write_synthetic_gguf import write_synthetic_gguf


def _bytes(t):
    return [np.asarray(p.raw).view(np.uint8).tobytes() for p in getattr(t, "parts", [t])]


@pytest.mark.parametrize("shape,fmt", [("tiny-moe", "Q8_0"), ("tiny-moe", "Q4_K"), ("tiny-glm4-moe", "BF16"),
                                       ("tiny-minimax-m2", "Q8_0"), ("tiny", "Q6_K"), ("tiny-moe", "MXFP4"),
                                       ("tiny-moe", "Q2_K"), ("tiny", "Q3_K")])
def test_file_is_the_synthetic_model(tmp_path, shape, fmt):
    path = tmp_path / f"{shape}.gguf"
    size = write_synthetic_gguf(shape, fmt, path, seed=3, report=lambda s: None)
    assert size == path.stat().st_size
    mem, ck = synthetic_checkpoint(shape, fmt, seed=3), load_checkpoint(path)
    assert ck.tensors.keys() == mem.tensors.keys()
    for name, t in mem.tensors.items():
        got = ck.tensors[name]
        assert (got.fmt, tuple(got.shape)) == (t.fmt, tuple(t.shape)), name
        assert _bytes(got) == _bytes(t), name
    family = get_family(mem.arch).ModelArgs
    a, b = (dataclasses.asdict(family.from_dict(c.config)) for c in (ck, mem))
    for d in (a, b):
        d["rms_norm_eps"] = np.float32(d["rms_norm_eps"])  # GGUF keeps a float32
        d.pop("rotary_dim", None)  # MiniMax-M2's config name of the rotated width: GGUF gives the factor
    assert a == b
    ids = np.random.default_rng(1).integers(0, b["vocab_size"], 12)
    la, lb = numpy_runner(ck, 64).prefill_logits(ids, 0), numpy_runner(mem, 64).prefill_logits(ids, 0)
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))


def test_nvfp4_file_holds_the_blocks_at_scale_one(tmp_path):
    """ggml's NVFP4 has no per-tensor scale: the synthetic blocks, their values over its 0.05."""
    path = tmp_path / "tiny-moe-nvfp4.gguf"
    write_synthetic_gguf("tiny-moe", "NVFP4", path, report=lambda s: None)
    mem, ck = synthetic_checkpoint("tiny-moe", "NVFP4"), load_checkpoint(path)
    for name in ("blk.0.attn_q", "blk.1.ffn_down_exps"):
        t, got = mem.tensors[name], ck.tensors[name]
        gs = (t.parts[0] if hasattr(t, "parts") else t).global_scale
        assert gs != 1.0 and _bytes(got) == _bytes(t)
        assert np.array_equal(got.dequantize() * np.float32(gs), t.dequantize())
