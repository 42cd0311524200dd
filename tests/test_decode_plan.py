"""The decode plan (backends/plan.py) without a GPU: the launches of one decode step of the
Qwen3-8B shape on an H100, per weight format, against the checked-in golden files
(tests/data/decode_plan_qwen3-8b_*.txt), and of the Qwen3-30B-A3B MoE shape in Q8_0
(decode_plan_qwen3-30b-a3b_q8_0.txt: the router matvec and top-k, moe_gu, moe_down), and of the
Qwen3.5-9B hybrid in Q8_0 (decode_plan_qwen3.5-9b_q8_0.txt: the gated DeltaNet and gated attention).  A change to a tuning rule, a kernel's defines, a grid
or a hand-off shows here as a diff to review; regenerate with

    python -m bw24chat.backends.plan qwen3-8b FORMAT > tests/data/decode_plan_qwen3-8b_FORMAT.txt
    python -m bw24chat.backends.plan qwen3-8b FORMAT --rows 4 > tests/data/decode_plan_qwen3-8b_FORMAT_rows4.txt
    python -m bw24chat.backends.plan qwen3-8b q8_0 --rows 8 > tests/data/decode_plan_qwen3-8b_q8_0_rows8.txt
"""
from pathlib import Path

import pytest

from bw24chat.backends.plan import GPUS, decode_plan, format_plan, layer_period
from bw24chat.synthetic import SHAPES

DATA = Path(__file__).parent / "data"


pytestmark = pytest.mark.kernels  # the plan reads register counts from ptxas (NVRTC: the [kernels] extra)


def _plan(fmt: str, gpu: str = "H100", m: int = 1, shape: str = "qwen3-8b"):
    cfg = SHAPES[shape]
    return decode_plan(cfg, {"default": fmt.upper()}, GPUS[gpu], m), cfg["num_hidden_layers"]


@pytest.mark.parametrize("fmt", ["bf16", "q8_0", "q4_k", "nvfp4"])
def test_qwen3_8b_plan_matches_the_golden_file(fmt):
    plan, layers = _plan(fmt)
    assert format_plan(plan, layers) == (DATA / f"decode_plan_qwen3-8b_{fmt}.txt").read_text()


def test_moe_plan_matches_the_golden_file():
    plan, layers = _plan("q8_0", shape="qwen3-30b-a3b")
    assert format_plan(plan, layers) == (DATA / "decode_plan_qwen3-30b-a3b_q8_0.txt").read_text()
    moe = [L.name for L in plan if L.family.startswith("moe")]
    assert moe == ["moe_router", "moe_gu", "moe_down"] * layers  # one launch per layer and projection


def test_the_plan_reads_the_gpu_it_is_made_for():
    """Grids come from the device's SM count and shared memory, never a constant: the same model
    planned for a 170-SM, 99 KB GPU (sm_120a) launches other grids and the sm_120a builds."""
    h100, _ = _plan("nvfp4")
    rtx, _ = _plan("nvfp4", "RTX5090")
    assert len(h100) == len(rtx) == 2 + 6 * 36 + 1
    assert {L.grid for L in h100} != {L.grid for L in rtx}
    attn = [L for L in rtx if L.family.startswith("attention")]
    assert attn and all(L.smem <= GPUS["RTX5090"].smem_block_optin for L in attn)


def test_rows_change_only_what_depends_on_them():
    """m = 4 rows: the same kernels in the same order (the row count is a define or grid axis),
    each matvec on the tensor-core kernel of the same bits (matvec_mma: cuda_linear.matvec_impl),
    and one sampler launch over the rows: the one-row step's blocks per row (sample_grid), as many
    rows at once as the SMs hold (sample_slots)."""
    one, _ = _plan("q8_0")
    four, _ = _plan("q8_0", m=4)
    assert [L.name for L in four] == [{"matvec": "matvec_mma"}.get(L.name, L.name) for L in one]
    s1, s4 = one[-1], four[-1]
    assert s1.name == "sample" and s1.grid[1] == 1 and s1.args[3] == "1"
    assert s4.grid == (s1.grid[0], min(4, GPUS["H100"].sm_count // s1.grid[0])) and s4.args[3] == "4"


@pytest.mark.parametrize("fmt", ["bf16", "q8_0", "q4_k", "nvfp4"])
def test_qwen3_8b_verify_plan_matches_the_golden_file(fmt):
    """The step of 4 rows (a verify of 3 drafts): its golden file, as the one-row step's."""
    plan, layers = _plan(fmt, m=4)
    assert format_plan(plan, layers) == (DATA / f"decode_plan_qwen3-8b_{fmt}_rows4.txt").read_text()


def test_eight_rows_run_the_down_projection_over_k_ranges():
    """The step of 8 rows (its golden file): the 12288-input down projection's 8 rows of x codes do
    not fit one matvec_mma launch beside its ring, so it runs as two launches over the k-tiles
    [0, 12) and [12, 24) of the same rows (matvec_mma.cu: K ranges), the chains carried through
    one scratch (mma_part), both reading the gate|up epilogue's QX codes; every other matvec is one
    launch over all its k-tiles."""
    plan, layers = _plan("q8_0", m=8)
    assert format_plan(plan, layers) == (DATA / "decode_plan_qwen3-8b_q8_0_rows8.txt").read_text()
    mma = [L for L in plan if L.name == "matvec_mma"]  # args: (q, h, s, d, gs, x, out, ..., qx_in, qx_out, part, kt0, kt1)
    down = [L for L in mma if L.args[0].endswith("ffn_down.q")]
    assert len(down) == 2 * layers
    for a, b in zip(down[::2], down[1::2]):
        assert a.args[0] == b.args[0] and a.key() == b.key() and a.args[14] == b.args[14] == "qx_act"
        assert a.args[-3:] == ("mma_part", "0", "12") and b.args[-3:] == ("mma_part", "12", "24")
    assert all(L.args[-3:-1] == ("0", "0") for L in mma if L not in down)


def test_hybrid_plan_matches_the_golden_file():
    """Qwen3.5-9B (24 gated DeltaNet layers, 8 gated attention layers, in runs of 3 + 1): a DeltaNet
    layer is one matvec of its four input projections (qkv | z | b | a), conv1d, the recurrence,
    the gated norm (each reading its column block) and the out matvec; an attention layer's rope
    reads the gated q (Q_GATED) and the output gate scales the attention before the o matvec."""
    cfg = SHAPES["qwen3.5-9b"]
    plan = decode_plan(cfg, {"default": "Q8_0"}, GPUS["H100"])
    assert layer_period(cfg) == 4
    assert format_plan(plan, 32, 4) == (DATA / "decode_plan_qwen3.5-9b_q8_0.txt").read_text()
    assert [L.name for L in plan if L.family == "deltanet"] == \
        ["deltanet_conv", "deltanet_recurrent", "deltanet_gated_norm"] * 24
    assert [L.name for L in plan if L.family == "elementwise"] == ["output_gate_rows"] * 8
    assert all(dict(L.defines)["Q_GATED"] == 1 for L in plan if L.family == "rope")
    assert len(plan) == 1 + 24 * 7 + 8 * 7 + 2


def test_hybrid_rows_read_positions_and_write_checkpoints():
    """A decode step of m rows runs the DeltaNet kernels over its m rows (one launch each), reading
    the rows' positions from the step image and writing each layer's checkpoint slots (the state
    before every row: CudaRunner.rollback); the slots cover a verify of MAX_K drafts."""
    from bw24chat.backends.cuda_deltanet import STATE_SLOTS
    from bw24chat.speculative import MAX_K

    assert STATE_SLOTS >= MAX_K + 1
    one, _ = _plan("q8_0", shape="tiny-qwen3.5")
    four, _ = _plan("q8_0", m=4, shape="tiny-qwen3.5")
    assert len(four) == len(one)
    for a, b in zip(one, four):  # the matvecs over rows of 256k inputs on matvec_mma (takes_mma), the same bits
        assert b.name == a.name or ((a.name, b.name) == ("matvec", "matvec_mma") and int(a.args[9]) % 256 == 0)
    rec = [L for L in four if L.name == "deltanet_recurrent"]
    conv = [L for L in four if L.name == "deltanet_conv"]
    assert len(rec) == len(conv) == 2
    for i, L in enumerate(rec):  # (qkv, ldq, b, ldb, a, lda, A, dt_bias, S, o, ldo, T, ..., pos, ckpt, stride, slots)
        assert L.args[11] == "4" and L.args[17] == "io+32" and L.args[18].startswith("ssm_ckpt")
        assert L.args[8] == ("ssm" if i == 0 else f"ssm+{6 * 128 * 128 * 4}") and L.args[-1] == str(STATE_SLOTS)
    for L in conv:  # (x, ldx, w, state, out, T, C, pos, ckpt, stride, slots)
        assert L.args[5] == "4" and L.args[7] == "io+32" and L.args[8].startswith("conv_ckpt")


def test_k_quant_mix_runs_each_format_on_its_own_kernels():
    """Q4_K_M (synthetic.MIXES: attn_v and ffn_down in Q6_K on the use_more_bits layers): such a
    layer's qkv, in two formats, is two matvecs (q|k on the Q4_K kernel, v on the Q6_K one) into
    scratch buffers, each put at its columns of the qkv buffer the rope reads; every other launch
    is the one-format plan's."""
    from bw24chat.synthetic import use_more_bits

    mix, layers = _plan("q4_k_m")
    plain, _ = _plan("q4_k")
    mixed = sum(use_more_bits(i, layers) for i in range(layers))
    assert 0 < mixed < layers and len(mix) == len(plain) + 3 * mixed
    puts = [L.line() for L in mix if L.name == "put_columns_rows"]
    assert len(puts) == 2 * mixed
    assert all("(qkv.0, qkv, 6144, 5120, 0)" in p for p in puts[0::2])
    assert all("(qkv.1, qkv+20480, 6144, 1024, 0)" in p for p in puts[1::2])
    v = [L for L in mix if L.name == "matvec" and "attn_v" in L.line() and "|" not in L.line().split("args=")[1].split(",")[0]]
    assert len(v) == mixed and all(dict(L.defines)["FMT"] == 10 for L in v)
