"""The CUDA batched step's pass (backends/cuda_batch.py) without a GPU: traced on symbolic buffers
(backends/plan.batch_plan), each group of at most 8 rows launches exactly the kernels of the solo
m-row decode step (backends/plan.decode_plan) -- the same builds, grids, blocks and shared memory,
so each row runs the one-row step's arithmetic -- with the attention kernels reading the paged
pool (KV_PAGE), and one sampler launch over the pass's rows.  bench's non-invariant variant of the
pass (gemm rows) instead runs each linear once over all the rows, as a prefill chunk does."""
from collections import Counter

import pytest

from bw24chat.backends.cuda_batch import bucket
from bw24chat.backends.plan import GPUS, batch_plan, decode_plan, prefill_plan
from bw24chat.synthetic import SHAPES

pytestmark = pytest.mark.kernels  # register counts from ptxas (NVRTC)


def _keys(plan) -> Counter:
    """Launch keys, the paged variant's KV_PAGE define dropped (it changes addresses only), and the
    decode attention's rows per block (ATTN_ROWS, the grid's x): the solo step's rows are one
    sequence and share blocks (cuda_ops.attn_decode_rows), the pass's rows one per block; a row's
    bits are the same either way (tests/gpu/test_attention.py: rows bit-identical for any m)."""
    def key(L):
        attn = L.family.startswith("attention_decode")
        grid = L.grid[1:] if attn else L.grid
        return (L.family, L.name, tuple(d for d in L.defines if d[0] not in ("KV_PAGE", "ATTN_ROWS")), grid, L.block,
                L.smem)
    return Counter(key(L) for L in plan)


# the launches a span of the pass makes once over all its rows (embedding, linears); the rest (rope /
# K/V write, attention) run per group of at most 8 rows
_PER_GROUP = ("rope", "attention")


@pytest.mark.parametrize("shape,fmt,kv,rows,span", [("qwen3-8b", "Q8_0", "bf16", 13, 16), ("qwen3-8b", "BF16", "q8_0", 8, 8),
                                                    ("qwen3-8b", "Q4_K", "fp8", 3, 16), ("qwen3-8b", "NVFP4", "f32", 17, 16),
                                                    ("qwen3-8b", "Q8_0", "bf16", 32, 16), ("qwen3-8b", "BF16", "bf16", 24, 8),
                                                    ("qwen3-30b-a3b", "Q8_0", "bf16", 10, 8)])
def test_each_group_launches_the_solo_steps_kernels(shape, fmt, kv, rows, span):
    """Each group of at most 8 rows launches the solo m-row step's rope and attention kernels, and
    the rest of the solo step's kernels (embedding, linears) where the linears run per group; where
    matvec_mma runs every linear (a dense model's Q8_0 / NVFP4 / Q4_K weights:
    cuda_batch.wide_rows) they run per span of 16 rows instead (m-row launches past the solo
    step's 8: test_the_wide_pass_reads_each_weight_once_per_16_rows)."""
    cfg = SHAPES[shape]
    plan = lambda m: [L for L in decode_plan(cfg, {"default": fmt}, GPUS["H100"], m, kv) if L.name != "sample"]  # noqa: E731
    got = batch_plan(cfg, {"default": fmt}, GPUS["H100"], rows, kv)
    per_group = lambda launches: _keys(L for L in launches if L.family.startswith(_PER_GROUP))  # noqa: E731
    want = Counter()
    for g0 in range(0, rows, 8):
        want += per_group(plan(min(8, rows - g0))) if span == 16 else _keys(plan(min(8, rows - g0)))
    samplers = [L for L in got if L.name == "sample"]
    if span == 16:
        assert per_group(got) == want
        # (the SIMT kernel only for a last span of one row, as in the solo one-row step)
        assert all(L.family == "matvec_mma" or dict(L.defines)["MV_M"] == rows % 16 == 1 for L in got if L.family.startswith("matvec"))
        assert max(dict(L.defines)["MV_M"] for L in got if L.family == "matvec_mma") == min(rows, 16)
    else:
        assert _keys(L for L in got if L.name != "sample") == want
    # one sampler launch over the pass's rows, each row on the one-row step's blocks
    one = decode_plan(cfg, {"default": fmt}, GPUS["H100"], 1, kv)[-1]
    n_sm = GPUS["H100"].sm_count
    assert len(samplers) == 1 and samplers[0].args[3] == str(rows)
    assert samplers[0].grid == (one.grid[0], min(rows, n_sm // one.grid[0])) and samplers[0].smem == one.smem
    attn = [L for L in got if L.family.startswith("attention")]
    assert attn and all(("KV_PAGE", 64) in L.defines for L in attn)
    rope = [L for L in got if L.family == "rope"]
    assert all(L.args[-1].startswith("bio") for L in rope)  # K/V to the pass's cache rows


@pytest.mark.parametrize("rows", [16, 32])
def test_the_wide_pass_reads_each_weight_once_per_16_rows(rows):
    """Qwen3-8B Q8_0: every 4096-input weight (qkv, o, gate|up, the LM head) is one 16-row
    matvec_mma launch per 16 rows; the 12288-input down projection, whose 16 rows of x do not fit
    one block's shared memory, takes them over mma_plan's K ranges (three 16-row launches, each
    on its own k-tiles, over gate|up's QX codes, the chains carried in the pass's scratch); rope
    and attention once per 8 rows."""
    cfg = SHAPES["qwen3-8b"]
    got = batch_plan(cfg, {"default": "Q8_0"}, GPUS["H100"], rows)
    mv = [L for L in got if L.family.startswith("matvec")]
    assert {L.family for L in mv} == {"matvec_mma"} and all(dict(L.defines)["MV_M"] == 16 for L in mv)
    weight = lambda L: next(a for a in L.args if a.endswith(".q"))  # noqa: E731
    k_tiles = lambda L: (int(L.args[-2]), int(L.args[-1]))  # noqa: E731 (args ..., part, kt0, kt1)
    reads = Counter(weight(L) for L in mv)
    rows_of = Counter(weight(L) for L in mv if k_tiles(L)[0] == 0 for _ in range(16))
    assert set(rows_of.values()) == {rows}  # every weight takes every row once
    down = {a for a in reads if "ffn_down" in a}
    assert down and len(reads) == 4 * cfg["num_hidden_layers"] + 1
    assert all(reads[a] == rows // 16 for a in reads if a not in down)
    for a in down:  # 24 k-tiles of 32 Q8_0 chunks in 3 ranges, per 16 rows
        launches = [L for L in mv if weight(L) == a]
        assert [k_tiles(L) for L in launches] == [(0, 8), (8, 16), (16, 24)] * (rows // 16)
        assert all({"qx_act", "mma_part"} <= {v.split("+")[0] for v in L.args} for L in launches)
    per_layer = Counter(L.family for L in got if L.family.startswith(_PER_GROUP))
    assert set(per_layer.values()) == {cfg["num_hidden_layers"] * rows // 8}

def test_buckets():
    """Exact up to 16 rows (a K = 8 verify's 9 rows pay for no padding), then multiples of 8."""
    assert [bucket(n) for n in (1, 5, 8, 9, 15, 16, 17, 24, 25, 63, 64)] == [1, 5, 8, 9, 15, 16, 24, 24, 32, 64, 64]
    assert len({bucket(n) for n in range(1, 65)}) == 22


# the prefill path's launches of a linear: the GEMMs (MoE: grouped), their activation preparation
# and a quantized weight's dequantized row blocks (cuda_linear.gemm, cuda_moe.prefill_experts)
_GEMM_PATH = ("gemm_wgmma", "gemm_i8", "gemm_mma", "gemm_act", "moe_group")


def _on_gemm_path(L) -> bool:
    return L.family in _GEMM_PATH or (L.family, L.name) == ("dequant", "dequant_bf16")


@pytest.mark.parametrize("shape,fmt,kv,rows", [("qwen3-8b", "Q8_0", "bf16", 13), ("qwen3-8b", "BF16", "q8_0", 24),
                                               ("qwen3-8b", "Q4_K", "fp8", 3), ("qwen3-30b-a3b", "Q8_0", "bf16", 10)])
def test_the_gemm_rows_pass_runs_each_linear_once_over_all_rows(shape, fmt, kv, rows):
    """bench's non-invariant variant of the pass (cuda_batch._GemmRowsOps): every linear (the LM
    head, the MoE router and experts included) is the prefill's GEMM over all the pass's rows --
    exactly the launches a prefill chunk of that many rows makes for them, no matvec -- while the
    rope / K/V writes and the paged attention run per group of at most 8 rows as in the invariant
    pass, and the one sampler launch is the same."""
    cfg, formats = SHAPES[shape], {"default": fmt}
    got = batch_plan(cfg, formats, GPUS["H100"], rows, kv, gemm_rows=True)
    inv = batch_plan(cfg, formats, GPUS["H100"], rows, kv)
    chunk = prefill_plan(cfg, formats, GPUS["H100"], T=rows, kv_type=kv, all_logits=True)
    assert _keys(L for L in got if _on_gemm_path(L)) == _keys(L for L in chunk if _on_gemm_path(L))
    assert not any(L.family.startswith(("matvec", "moe_experts")) and L.name != "moe_combine" for L in got)
    if fmt in ("Q8_0", "BF16") and shape == "qwen3-8b":  # GEMMs on the codes: one launch reads each matrix
        reads = Counter(a for L in got if _on_gemm_path(L) for a in L.args if a.endswith(".q"))
        solo = Counter(a for L in inv if L.family.startswith("matvec") for a in L.args if a.endswith(".q"))
        assert set(reads) == set(solo) and set(reads.values()) == {1}
        assert min(solo.values()) >= -(-rows // 16)  # the invariant pass: at least once per span of 16
    # per group as in the invariant pass; the attention writes no QX codes (the o projection's
    # GEMM takes its float outputs)
    per_group = lambda plan: Counter((k[0], k[1], tuple(d for d in k[2] if d[0] != "ATTN_QX"), *k[3:])
                                     for k in _keys(L for L in plan if L.family.startswith("attention") or L.family == "rope").elements())
    assert per_group(got) == per_group(inv)
    assert [L.key() for L in got if L.name == "sample"] == [L.key() for L in inv if L.name == "sample"]


@pytest.mark.parametrize("shape,fmt", [("tiny", "Q8_0"), ("qwen3-8b", "Q8_0"), ("qwen3-8b", "NVFP4"), ("qwen3-8b", "BF16")])
def test_step_bytes_counts_the_passes_qx_buffers(shape, fmt):
    """cuda_batch.step_bytes scales the one-row step's decode buffers to a pass; the QX buffers
    that only the m-row steps' matvec_mma hands over (none at one row on the tiny model) are
    counted too (_qx_unallocated): every pass buffer the one-row step lacks is within that."""
    from bw24chat.backends import cuda_batch
    from bw24chat.backends.cuda_batch import BatchStep, PASS_ROWS
    from bw24chat.backends.cuda_opset import CudaOps
    from bw24chat.backends.plan import PlanRunner, SymArray, _tensors, planning
    from bw24chat.backends.runner import MAX_ROWS
    from bw24chat.models import get_family

    cfg = SHAPES[shape]
    fam = get_family(cfg["model_type"])
    args = fam.ModelArgs.from_dict(cfg)
    with planning(GPUS["H100"]):
        r = PlanRunner(args, fam.Model, _tensors(cfg, {"default": fmt}, fam.Model, args), "bf16", 4096, "f32")
        r.prefill_chunk = 512
        r.model.forward(CudaOps(r, 1, decode=True), r.d_tokens[:1])  # what the warm-up's one-row step allocates
        one_row = {(name[2:], cols) for name, cols, _ in r._bufs if name.startswith("d:")}
        bat = BatchStep(r, 64, zeros=lambda name, shape, dtype: SymArray(name, shape, dtype))
        for rows in (PASS_ROWS, 8, 5, 2):
            bat.forward(rows)
    lacking = sum(4 * PASS_ROWS * cols[0] for name, cols, _ in bat._bufs if name.startswith("qx_") and (name, cols) not in one_row)
    assert lacking <= cuda_batch._qx_unallocated(r) * PASS_ROWS // MAX_ROWS
    if (shape, fmt) == ("tiny", "Q8_0"):
        assert lacking > 0  # the case this guards: gate|up's codes for down at m >= 2 only


def test_step_bytes_counts_the_k_ranges_scratch():
    """The Qwen3-8B down projection splits K at 7 and 8 rows, and at 9..16 in the wide pass's
    16-row spans: the pass's chain scratch is in step_bytes (one per size: two, three and four
    n-tiles, 4 + 6 + 8 MiB); the tiny model splits nothing."""
    from bw24chat.backends import cuda_batch
    from bw24chat.backends.plan import PlanRunner, _tensors, planning
    from bw24chat.models import get_family

    got = {}
    for shape in ("qwen3-8b", "tiny"):
        cfg = SHAPES[shape]
        fam = get_family(cfg["model_type"])
        args = fam.ModelArgs.from_dict(cfg)
        with planning(GPUS["H100"]):
            r = PlanRunner(args, fam.Model, _tensors(cfg, {"default": "Q8_0"}, fam.Model, args), "bf16", 4096, "f32")
            got[shape] = cuda_batch._mma_part_bytes(r)
    assert got["tiny"] == 0
    assert got["qwen3-8b"] == 18 << 20
