"""The CUDA runner over several GPUs (backends/cuda_sharded.py), what a CPU can check: the model
each GPU computes, and what is refused, naming it, before anything loads (the GPU tests:
tests/gpu/test_parallel_gpu.py)."""
from types import SimpleNamespace

import pytest

from bw24chat.backends.cuda_sharded import get_family_args, local_args, refuse_unbuilt
from bw24chat.options import OptionError
from bw24chat.synthetic import SHAPES, synthetic_checkpoint


def _args(shape: str):
    return get_family_args(SimpleNamespace(arch=SHAPES[shape]["model_type"], config=SHAPES[shape]))


def test_each_gpu_computes_its_heads_and_widths():
    a = _args("qwen3-8b-151k")  # 32 heads, 8 KV heads, F 12288
    two, sixteen = local_args(a, 2), local_args(a, 16)
    assert (two.num_attention_heads, two.num_key_value_heads, two.head_dim, two.intermediate_size) == (16, 4, 128, 6144)
    assert (two.hidden_size, two.vocab_size, two.num_hidden_layers) == (a.hidden_size, a.vocab_size, a.num_hidden_layers)
    assert (sixteen.num_attention_heads, sixteen.num_key_value_heads) == (2, 1)  # a KV head kept on 2 GPUs each
    h = _args("qwen3.5-9b")
    lh = local_args(h, 2)
    assert (lh.linear_num_key_heads, lh.linear_num_value_heads) == (h.linear_num_key_heads // 2, h.linear_num_value_heads // 2)
    assert lh.deltanet_spec().v_head_order == h.deltanet_spec().v_head_order


@pytest.mark.parametrize("shape", ["tiny-moe", "tiny-qwen3.5-moe", "tiny-glm4-moe", "tiny-minimax-m2"])
def test_moe_models_are_refused_naming_why(shape):
    with pytest.raises(OptionError, match="needs MoE experts split by expert ranges, which the engine does not run "
                                          "over several GPUs yet"):
        refuse_unbuilt(synthetic_checkpoint(shape, "Q8_0"), 2)


def test_dense_and_hybrid_models_pass():
    for shape in ("tiny", "tiny-qwen3.5"):
        refuse_unbuilt(synthetic_checkpoint(shape, "Q8_0"), 2)
