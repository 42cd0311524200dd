"""The CUDA runner over several GPUs (backends/cuda_sharded.py), what a CPU can check: the model
each GPU computes, and what is refused, naming it, before anything loads (the GPU tests:
tests/gpu/test_parallel_gpu.py)."""
from types import SimpleNamespace

import pytest

from bw24chat.backends.cuda_sharded import get_family_args, local_args
from bw24chat.parallel import PartitionError, plan_for
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


def test_every_family_is_planned_and_what_does_not_split_is_refused():
    """Dense, hybrid and MoE families split (MoE experts by index ranges, MiniMax-M2's whole-
    projection QK-norm by heads); a split that would copy MiniMax-M2's KV heads onto several GPUs
    is refused by the plan, naming it."""
    for shape in ("tiny", "tiny-qwen3.5", "tiny-moe", "tiny-qwen3.5-moe", "tiny-glm4-moe", "tiny-minimax-m2"):
        plan_for(synthetic_checkpoint(shape, "Q8_0"), 2)
    with pytest.raises(PartitionError, match="QK-norm over the whole k projection needs each KV head on one GPU"):
        plan_for(synthetic_checkpoint("tiny-minimax-m2", "Q8_0"), 4)
