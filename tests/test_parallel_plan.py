"""The tensor-parallel partition plan (bw24chat/parallel.py): every weight of every family gets a
split that keeps whole GQA groups / DeltaNet key-head groups / hidden units on one GPU, the
pieces of a split tensor cover it once, the per-GPU bytes add up to the checkpoint's, and a
dimension that does not divide is refused naming it."""
import numpy as np
import pytest

from bw24chat.loaders.tensor import QTensor
from bw24chat.models import get_family
from bw24chat.parallel import (COLS, EXPERTS, REPLICATE, ROWS, VOCAB, PartitionError, local_deltanet, partition,
                               plan_for)
from bw24chat.synthetic import SHAPES, random_matrix, synthetic_checkpoint

# real shapes (synthetic.SHAPES) of every family the plan covers
FAMILY_SHAPES = ["qwen3-8b-151k", "llama3-1b", "qwen3-30b-a3b", "glm-4.5-air", "minimax-m2", "qwen3.5-9b",
                 "qwen3.5-35b-a3b", "tiny-qwen3.5"]


def _plan(shape: str, world: int, **overrides):
    cfg = {**SHAPES[shape], **overrides}
    fam = get_family(cfg["model_type"])
    return partition(fam.Model, fam.ModelArgs.from_dict(cfg), world), fam.ModelArgs.from_dict(cfg)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("shape", FAMILY_SHAPES)
def test_pieces_cover_each_tensor_once(shape, world):
    """Split tensors: the GPUs' index sets are disjoint and cover the axis (KV heads: every head
    kept somewhere, each GPU the same number; vocabulary and experts: near-equal ranges)."""
    try:
        plan, a = _plan(shape, world)
    except PartitionError as exc:  # the shapes that do not divide say which dimension
        assert f"--gpus {world}:" in str(exc) and " = " in str(exc)
        return
    for name, s in plan.splits.items():
        shape_ = plan.shapes[name]
        if s.kind == REPLICATE:
            assert s.ranges == ()
            continue
        n = shape_[-1] if s.kind == COLS else shape_[0]
        got = np.concatenate([s.indices(r) for r in range(world)])
        role = name.rsplit(".", 1)[-1]
        if role in ("attn_k", "attn_v", "attn_k_bias", "attn_v_bias") and a.num_key_value_heads < world:
            assert set(got) == set(range(n)) and len({s.count(r) for r in range(world)}) == 1
        else:
            assert sorted(got) == list(range(n)), name
        if s.kind in (ROWS, COLS):
            assert len({s.count(r) for r in range(world)}) == 1, name  # equal shares: the reduction's operands


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gpus_keep_whole_gqa_groups(world):
    """Every query head a GPU holds reads a KV head the same GPU holds (attn_q's rows are
    heads of hd, grouped H / K per KV head), with and without KV heads shared by GPUs."""
    for K in (8, 2):
        plan, a = _plan("qwen3-8b", world, num_key_value_heads=K)
        hd, G = a.head_dim, a.num_attention_heads // K
        q, k = plan.splits["blk.0.attn_q"], plan.splits["blk.0.attn_k"]
        for r in range(world):
            q_heads = set(q.indices(r)[::hd] // hd)
            kv_heads = set(k.indices(r)[::hd] // hd)
            assert {h // G for h in q_heads} == kv_heads


@pytest.mark.parametrize("order", ["grouped", "tiled"])
def test_deltanet_heads_keep_their_order(order):
    """A GPU's value heads, in its local order, read its own key heads by the same rule
    (grouped: j // (Hv / Hk), tiled: j % Hk) as the whole layer, so the op runs unchanged on
    local_deltanet's spec."""
    plan, a = _plan("qwen3.5-9b", 4, linear_v_head_order=order)
    s, world = a.deltanet_spec(), 4
    loc = local_deltanet(s, world)
    beta = plan.splits["blk.0.ssm_beta"]  # one row per value head
    for r in range(world):
        for jl, j in enumerate(beta.indices(r)):
            key = j % s.n_k_heads if order == "tiled" else j // (s.n_v_heads // s.n_k_heads)
            key_local = jl % loc.n_k_heads if order == "tiled" else jl // (loc.n_v_heads // loc.n_k_heads)
            assert key == r * loc.n_k_heads + key_local
    # the conv's channels are q | k | v of those heads, as attn_qkv's rows
    assert plan.splits["blk.0.ssm_conv1d"] == plan.splits["blk.0.attn_qkv"]
    assert plan.splits["blk.0.attn_qkv"].count(0) == loc.conv_dim


def test_split_kinds():
    plan, _ = _plan("glm-4.5-air", 2)
    kinds = {n.split(".", 2)[-1]: s.kind for n, s in plan.splits.items() if n.startswith(("blk.1.", "tok", "out"))}
    assert kinds == {"attn_q": ROWS, "attn_k": ROWS, "attn_v": ROWS, "attn_q_bias": ROWS, "attn_k_bias": ROWS,
                     "attn_v_bias": ROWS, "attn_q_norm": REPLICATE, "attn_k_norm": REPLICATE, "attn_o": COLS,
                     "attn_norm": REPLICATE, "ffn_norm": REPLICATE, "ffn_gate_inp": REPLICATE, "exp_probs_b": REPLICATE,
                     "ffn_gate_exps": EXPERTS, "ffn_up_exps": EXPERTS, "ffn_down_exps": EXPERTS,
                     "ffn_gate_shexp": ROWS, "ffn_up_shexp": ROWS, "ffn_down_shexp": COLS,
                     "ffn_gate_inp_shexp": REPLICATE, "tok_embd": VOCAB, "output": VOCAB, "output_norm": REPLICATE}
    mm, _ = _plan("minimax-m2", 2)  # its QK-norm spans every head: split with them, one more exchange
    assert mm.splits["blk.0.attn_q_norm"].kind == ROWS
    assert [c.after for c in mm.collectives(0)] == ["attn_q_norm/attn_k_norm", "attn_o", "ffn_down_exps"]
    assert [c.after for c in plan.collectives(0)] == ["attn_o", "ffn_down"]  # GLM's first layer is dense
    hy, _ = _plan("qwen3.5-9b", 2)
    assert [c.after for c in hy.collectives(0)] == ["ssm_out", "ffn_down"]
    assert [(c.op, c.values) for c in hy.pass_collectives()] == [("all-reduce", 4096), ("all-gather", 124160)]
    one, _ = _plan("qwen3-8b", 1)  # one piece each: nothing to exchange
    assert one.collectives(0) == [] and one.pass_collectives() == []
    assert all(len(s.ranges) in (0, 1) for s in one.splits.values())


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("shape,fmt", [("qwen3-8b", "BF16"), ("tiny-moe", "Q8_0"), ("tiny-glm4-moe", "BF16"),
                                       ("tiny-qwen3.5", "BF16")])
def test_weight_bytes_add_up(shape, fmt, world):
    """The GPUs' bytes add up to the checkpoint's plus the extra copies of the replicated tensors
    (and of the KV projections where GPUs share KV heads); the KV cache per position and the
    DeltaNet state are shared out evenly."""
    ck = synthetic_checkpoint(shape, fmt)
    try:
        plan = plan_for(ck, world)
    except PartitionError:
        assert shape == "tiny-qwen3.5" and world == 4  # Hk = 2
        return
    per = plan.weight_bytes(ck.tensors)
    replicated = sum(t.nbytes for n, t in ck.tensors.items() if plan.splits[n].kind == REPLICATE)
    K = ck.config["num_key_value_heads"]
    kv = sum(t.nbytes for n, t in ck.tensors.items() if n.endswith(("attn_k", "attn_v", "attn_k_bias", "attn_v_bias")))
    assert sum(per) == ck.nbytes + (world - 1) * replicated + (world // K - 1 if world > K else 0) * kv
    assert max(per) - min(per) <= replicated + max(t.nbytes for t in ck.tensors.values() if t.shape[0] == ck.config["vocab_size"]) / world
    one = plan_for(ck, 1)
    assert plan.kv_token_bytes("bf16") * min(world, K) == one.kv_token_bytes("bf16")
    assert plan.state_bytes() * world == one.state_bytes()


def test_refusals_name_the_dimension():
    with pytest.raises(PartitionError, match=r"--gpus 3: num_key_value_heads = 8 neither divides over 3 GPUs"):
        _plan("qwen3-8b", 3, num_attention_heads=48)
    with pytest.raises(PartitionError, match=r"--gpus 3: num_attention_heads = 32 does not divide"):
        _plan("qwen3-8b", 3)
    with pytest.raises(PartitionError, match=r"--gpus 4: intermediate_size = 12294 does not divide"):
        _plan("qwen3-8b", 4, intermediate_size=12294)
    with pytest.raises(PartitionError, match=r"--gpus 4: linear_num_key_heads = 2 does not divide"):
        _plan("tiny-qwen3.5", 4)
    with pytest.raises(PartitionError, match=r"num_key_value_heads = 8 does not divide over 16 GPUs, and the QK-norm"):
        _plan("minimax-m2", 16)
    with pytest.raises(PartitionError, match=r"--gpus 0"):
        _plan("qwen3-8b", 0)
    # a row-parallel split inside a format's blocks: K-quants hold 256 values per block
    ck = synthetic_checkpoint({**SHAPES["tiny"], "intermediate_size": 1280}, "Q4_K")
    with pytest.raises(PartitionError, match=r"blk.0.ffn_down \(Q4_K\) would be split at input 640"):
        plan_for(ck, 2)
    assert plan_for(ck, 1).world == 1  # nothing to split with one GPU
    plan_for(synthetic_checkpoint({**SHAPES["tiny"], "intermediate_size": 1280}, "Q8_0"), 2)  # 32-value blocks fit


@pytest.mark.parametrize("fmt", ["F32", "BF16", "Q8_0", "Q4_K", "NVFP4", "Q4_0"])
def test_take_cols_is_the_columns(fmt):
    """QTensor.take_cols (a GPU's share of a row-parallel weight) views the same bytes: its values
    are the whole tensor's columns; a cut inside a block is refused."""
    rng = np.random.default_rng(3)
    t = random_matrix(fmt, 5, 1024, rng) if fmt not in ("F32",) else QTensor("w", "F32", (5, 1024), rng.standard_normal((5, 1024)).astype(np.float32))
    t.name = "w"
    full = t.dequantize()
    for lo, hi in ((0, 512), (512, 1024), (256, 768)):
        part = t.take_cols(((lo, hi),), "w.part")
        assert part.shape == (5, hi - lo) and part.fmt == t.fmt
        np.testing.assert_array_equal(part.dequantize(), full[:, lo:hi])
    two = t.take_cols(((768, 1024), (0, 256)), "w.part")  # a tiled DeltaNet's value heads: several runs
    np.testing.assert_array_equal(two.dequantize(), np.concatenate([full[:, 768:], full[:, :256]], axis=1))
    if fmt not in ("F32", "BF16"):
        with pytest.raises(ValueError, match="split a"):
            t.take_cols(((0, 8),), "w.part")
