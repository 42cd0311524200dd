"""CudaRunner.step over m = 1..9 rows of one sequence: each row's logits and sampled token equal
a one-row step at its position, bit for bit, graph and eager (what speculative verify relies
on), for BF16 (the SIMT kernel at every m) and the integer-dot formats (the SIMT kernel, or at m >= 2
matvec_mma of the same bits: the plan says which), both activation contracts; and the runner
equals the NumPy runner's greedy tokens on a tiny model."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams

FORMATS = ("BF16", "Q8_0", "NVFP4", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "Q2_K", "Q3_K", "Q4_K_M")


@pytest.fixture(scope="module")
def models():
    from bw24chat.synthetic import synthetic_checkpoint

    return {fmt: synthetic_checkpoint("tiny", fmt) for fmt in FORMATS}


def _matvec_kernels(r, m: int) -> set:
    from bw24chat.backends.kernel_build import KernelLaunch

    return {L.kernel.name for L in r.plan(m) if isinstance(L, KernelLaunch) and L.kernel.name.startswith("matvec")}


def _rows_equal_single_steps(r, rows: list, prompt: list):
    sp = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)
    r.prefill(prompt, 0)
    single, single_logits = [], []
    for i, t in enumerate(rows):
        single += r.step([t], len(prompt) + i, sp, 5, prompt + rows[:i])
        single_logits.append(r.last_logits()[0])
    for m in range(1, 10):  # 9 rows: two passes (a verify of K = 8 drafts)
        r.prefill(prompt, 0)
        got = r.step(rows[:m], len(prompt), sp, 5, prompt)
        assert got == single[:m], m
        assert np.array_equal(r.last_logits().view(np.uint32), np.stack(single_logits[:m]).view(np.uint32)), m


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("graph", [True, False])
def test_rows_equal_single_steps(cp, models, fmt, graph):
    from bw24chat.backends.cuda_runner import CudaRunner

    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 45)]
    rows = [int(t) for t in rng.integers(0, 4096, 9)]
    r = CudaRunner(models[fmt], 1024, "bf16", use_graph=graph)
    _rows_equal_single_steps(r, rows, prompt)
    from bw24chat.backends.cuda_linear import MMA_FORMATS
    from bw24chat.synthetic import MIXES

    for m in (1, 2, 5, 8):  # a K-quant mix: each format's kernel
        want = {"matvec_mma" if m >= 2 and f in MMA_FORMATS else "matvec" for f in MIXES.get(fmt, (fmt,))}
        assert _matvec_kernels(r, m) == want, (fmt, m)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4", "Q4_K"])
def test_rows_equal_single_steps_bf16_activations(cp, models, fmt):
    """The bf16-activation contract (x rounded to bf16 before every product, the QX codes of the
    rounded values): the same row invariance."""
    from bw24chat.backends.cuda_runner import CudaRunner

    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 45)]
    rows = [int(t) for t in rng.integers(0, 4096, 9)]
    _rows_equal_single_steps(CudaRunner(models[fmt], 1024, "bf16", activations="bf16"), rows, prompt)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4"])
@pytest.mark.parametrize("graph", [True, False])
def test_rows_equal_single_steps_over_k_ranges(cp, fmt, graph):
    """An FFN of 12288 (the Qwen3-8B down projection's inputs): at m = 7, 8 on an H100 (sooner on
    a 99 KB GPU) the down matvec runs as launches over K ranges (cuda_linear.mma_plan), the chains
    carried through a scratch allocated when the plan is traced, before any capture; the m-row
    steps, captured and eager, equal the one-row steps bit for bit."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.kernel_build import KernelLaunch
    from bw24chat.synthetic import SHAPES, synthetic_checkpoint

    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 45)]
    rows = [int(t) for t in rng.integers(0, 4096, 9)]
    r = CudaRunner(synthetic_checkpoint({**SHAPES["tiny"], "intermediate_size": 12288}, fmt), 1024, "bf16",
                   use_graph=graph)
    _rows_equal_single_steps(r, rows, prompt)
    layers = SHAPES["tiny"]["num_hidden_layers"]
    for m in (7, 8):  # args (..., qx_in, qx_out, part, kt0, kt1): every layer's down over K ranges, on the QX codes
        later = [L for L in r.plan(m) if isinstance(L, KernelLaunch) and L.kernel.name == "matvec_mma" and int(L.args[-2]) > 0]
        assert later and len(later) % layers == 0, m
        assert all(not isinstance(L.args[14], np.uint64) for L in later), m


def greedy_tokens_cuda_and_numpy(ck, n: int = 16) -> dict:
    """16 greedy tokens after a 40-token prompt on the CudaRunner (f32 cache) and the NumPy runner."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.numpy_backend import numpy_runner

    prompt = list(range(100, 140))
    greedy = SamplingParams(temperature=0)
    out = {}
    for name, r in (("cuda", CudaRunner(ck, 512, "f32")), ("numpy", numpy_runner(ck, 512))):
        tok, toks = r.prefill(prompt, 0, greedy), []
        for i in range(n):
            toks.append(tok)
            tok = r.step([tok], len(prompt) + i, greedy, 0, [])[0]
        out[name] = toks
    return out


def test_greedy_tokens_equal_the_numpy_runner(cp, models):
    out = greedy_tokens_cuda_and_numpy(models["BF16"])
    assert out["cuda"] == out["numpy"]


def test_k_quant_mix_equals_the_numpy_runner(cp, models):
    """llama.cpp's Q4_K_M mix (q and k in Q4_K, v in Q6_K on the use_more_bits layers: one fused
    qkv in two formats, cuda_weights.PartedWeight): the logits of a prefill and of 8 decode steps
    within 1e-3 of the NumPy runner under the same integer-dot contract, the same greedy tokens."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner

    ck = models["Q4_K_M"]
    assert {ck.tensors[f"blk.{i}.attn_v"].fmt for i in range(3)} == {"Q4_K", "Q6_K"}
    prompt, greedy = list(range(100, 140)), SamplingParams(temperature=0)
    got = {}
    for name, r in (("cuda", CudaRunner(ck, 512, "f32")), ("numpy", numpy_runner(ck, 512, NumpyBackend(act_quant=True)))):
        tok, toks, logits = r.prefill(prompt, 0, greedy), [], []
        for i in range(8):
            toks.append(tok)
            logits.append(np.asarray(r.last_logits(), np.float64).reshape(-1))
            tok = r.step([tok], len(prompt) + i, greedy, 0, [])[0]
        got[name] = toks, np.stack(logits)
    assert got["cuda"][0] == got["numpy"][0]
    err = np.linalg.norm(got["cuda"][1] - got["numpy"][1]) / np.linalg.norm(got["numpy"][1])
    assert err <= 1e-3, err
