"""The MTP head on CudaRunner (models/mtp.py; mtp_forward, mtp_draft): its logits and g against the
NumPy head's on the same trunk hidden states (a dense head on the synthetic "tiny" shape, and a
GLM-4.5-style MoE head shipping its own LM head), on the decode passes and on the prefill path
(ops.concat there too); the trunk's hidden rows (last_hidden) against NumPy's; a pass of m rows = m one-row passes, bit for bit; graph = eager; the device draft chain =
the host's drafting loop over the CUDA head's own logits (greedy and seeded sampling with a
repetition penalty); --spec mtp token-identical to plain decoding for K = 1..8 with a head built to
copy the trunk (accepted most of the time: catch-ups of up to K + 1 rows, rolled-back chains).
The random-head gate over the nine prompts is tests/gpu/test_speculative.py (check.spec_gates).
A head over a reduced draft vocabulary (FR-Spec; loaders/draft_head.py) the same way: the
vocab_expand kernel = its reference bit for bit, its logits and drafts = NumPy's, the chain = the
host loop, --spec mtp = plain decoding."""
from dataclasses import replace

import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.sampling import sample_token
from bw24chat.speculative import MAX_K

SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64)))


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """name -> (checkpoint, integer-dot contract on the NumPy side)."""
    from bw24chat.loaders import load_checkpoint
    from bw24chat.synthetic import synthetic_checkpoint
    from tests.model_factory import make_hf_dir

    d, _ = make_hf_dir(tmp_path_factory.mktemp("glm") / "m", "glm4_moe", "BF16", head_dim=32, num_nextn_predict_layers=1)
    return {"tiny/BF16": (synthetic_checkpoint("tiny", "BF16", mtp=True), False),
            "tiny/Q8_0": (synthetic_checkpoint("tiny", "Q8_0", mtp=True), True),
            "glm4_moe/BF16": (load_checkpoint(d), False)}


def _runners(ck, act_quant: bool, graph: bool = True):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.backends.numpy_backend import NumpyBackend, numpy_runner

    return CudaRunner(ck, 512, "f32", use_graph=graph), numpy_runner(ck, 512, NumpyBackend(act_quant=act_quant))


def _prefilled(ck, aq, rng):
    """The CUDA and NumPy runners of a head's checkpoint after the same random 22-token prompt,
    and NumPy's trunk hidden states over it."""
    cu, ref = _runners(ck, aq)
    prompt = [int(t) for t in rng.integers(0, ck.config["vocab_size"], 22)]
    for r in (cu, ref):
        r.prefill(prompt, 0)
    return cu, ref, prompt, ref.last_hidden()


@pytest.mark.parametrize("name", ["tiny/BF16", "tiny/Q8_0", "glm4_moe/BF16"])
def test_head_equals_the_numpy_head(cp, heads, name, rng):
    """Catch-up passes of 8 + 8 + 5 rows, then chained rows, on the same inputs both sides."""
    ck, aq = heads[name]
    cu, ref, prompt, H = _prefilled(ck, aq, rng)
    # the tensor-core prefill against NumPy: under the integer-dot contract (Q8_0) an activation at
    # a rounding boundary takes the neighbouring int8 code on one side (check: ~1.5e-4 rel L2)
    assert cu.last_hidden().shape == H.shape and _rel(cu.last_hidden(), H) < (5e-4 if aq else 1e-4)
    want = ref.mtp_forward(prompt[1:], H[:-1], 0, True)
    got = cu.mtp_forward(prompt[1:], H[:-1], 0, True)
    tol = 5e-4 if aq else 1e-4  # the same code flips in the head's own rows and its KV cache
    for j in range(4):  # the catch-up's last row, then three chained rows on the same token and g
        assert _rel(got[0], want[0]) < tol and _rel(got[1], want[1]) < tol, (j, _rel(got[0], want[0]), _rel(got[1], want[1]))
        t = int(np.argmax(want[0]))
        g = want[1]
        want = ref.mtp_forward([t], g[None], len(prompt) - 1 + j, False)
        got = cu.mtp_forward([t], g[None], len(prompt) - 1 + j, False)


def test_head_on_the_prefill_path(cp, heads, rng):
    """ops.concat on the prefill path: the head's forward on CudaOps(decode=False) over its own
    cache (tensor-core GEMMs, FlashAttention) = the NumPy head, to the prefill's rounding."""
    from bw24chat.backends.cuda_opset import CudaOps

    ck, aq = heads["tiny/BF16"]
    cu, ref = _runners(ck, aq)
    prompt = [int(t) for t in rng.integers(0, 4096, 40)]
    ref.prefill(prompt, 0)
    H = ref.last_hidden()
    want = ref.mtp_forward(prompt[1:], H[:-1], 0, True)
    T = len(prompt) - 1
    with cu.stream:
        cu.p_ids[:T].set(np.asarray(prompt[1:], np.int32), stream=cu.stream)
        cu.p_pos[:T].set(np.arange(T, dtype=np.int32), stream=cu.stream)
        ops = CudaOps(cu, T, decode=False, start=0)
        ops.cache_k, ops.cache_v = [cu.cuda_mtp.cache_k], [cu.cuda_mtp.cache_v]
        logits, g = cu.mtp.forward(ops, prompt[1:], cp.asarray(H[:-1]), True)
    cu.stream.synchronize()
    assert _rel(logits.get()[0], want[0]) < 1e-3 and _rel(g.get()[-1], want[1]) < 1e-3


@pytest.mark.parametrize("name", ["tiny/BF16", "glm4_moe/BF16"])
def test_last_hidden_of_steps(cp, heads, name, rng):
    """last_hidden after a step of 3 and of 9 rows (two passes: the first pass's rows kept)."""
    ck, aq = heads[name]
    cu, ref = _runners(ck, aq)
    prompt = [int(t) for t in rng.integers(0, ck.config["vocab_size"], 30)]
    rows = [int(t) for t in rng.integers(0, ck.config["vocab_size"], 9)]
    for m in (3, 9):
        for r in (cu, ref):
            r.prefill(prompt, 0)
            r.step(rows[:m], len(prompt), SamplingParams(temperature=0), 0, prompt)
        assert cu.last_hidden().shape == (m, ck.config["hidden_size"])
        assert _rel(cu.last_hidden(), ref.last_hidden()) < 1e-4, m


@pytest.mark.parametrize("graph", [True, False])
def test_head_rows_equal_one_row_passes(cp, heads, graph, rng):
    """The head over m rows (one or two passes) = m one-row passes, bit for bit: logits, g, and the
    head's cache the passes leave (a further chained row)."""
    ck, _ = heads["tiny/BF16"]
    from bw24chat.backends.cuda_runner import CudaRunner

    r = CudaRunner(ck, 512, "bf16", use_graph=graph)
    prompt = [int(t) for t in rng.integers(0, 4096, 20)]
    r.prefill(prompt, 0)
    H = r.last_hidden()
    for m in (1, 2, 5, 8, 9):
        start = len(prompt) - 1 - m
        ids, hid = prompt[start + 1:start + 1 + m], H[start:start + m]
        one = [r.mtp_forward(ids[i:i + 1], hid[i:i + 1], start + i, True) for i in range(m)][-1]
        after_one = r.mtp_forward([7], one[1][None], start + m, False)
        many = r.mtp_forward(ids, hid, start, True)
        after_many = r.mtp_forward([7], many[1][None], start + m, False)
        for a, b in zip(one + after_one, many + after_many):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), m


def _drafts_and_logits(r, ids, H, k, sp, seed, history):
    drafts = r.mtp_draft(ids, H, 0, k, sp, seed, history)
    return drafts, r.cuda_mtp.logits.get(), r.cuda_mtp.g.get()


def test_head_graph_equals_eager(cp, heads, rng):
    """mtp_draft's passes and chains as CUDA graphs = the same launches run eagerly, for every K."""
    from bw24chat.backends.cuda_runner import CudaRunner

    ck, _ = heads["tiny/BF16"]
    prompt = [int(t) for t in rng.integers(0, 4096, 13)]
    out = {}
    for graph in (True, False):
        r = CudaRunner(ck, 512, "bf16", use_graph=graph)
        r.prefill(prompt, 0)
        H = r.last_hidden()
        out[graph] = [_drafts_and_logits(r, prompt[1:], H[:-1], k, sp, 5, prompt)
                      for k in range(1, MAX_K + 1) for sp in (SamplingParams(temperature=0), SAMPLED)]
    for a, b in zip(out[True], out[False]):
        assert a[0] == b[0]
        assert np.array_equal(a[1].view(np.uint32), b[1].view(np.uint32))
        assert np.array_equal(a[2].view(np.uint32), b[2].view(np.uint32))


def _host_chain(r, history, H, k, sp, seed=11):
    """The draft chain as a host loop: mtp_forward, then sampling.sample_token at position p + j
    after the history and the drafts before it."""
    logits, g = r.mtp_forward(history[1:], H, 0, True)
    p, want = len(history), []
    for j in range(k):
        want.append(sample_token(logits, sp, seed, p + j, history + want))
        if j + 1 < k:
            logits, g = r.mtp_forward([want[-1]], g[None], p - 1 + j, False)
    return want


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0), SAMPLED], ids=["greedy", "sampled"])
def test_device_chain_equals_the_host_loop(cp, heads, sp, rng):
    """The device draft chain (sampler pushing each draft to its ring, chained rows embedding the
    sampled token on the device) = the reference loop on the host: mtp_forward, then
    sampling.sample_token at position p + j after the history and the drafts before it."""
    from bw24chat.backends.cuda_runner import CudaRunner

    ck, _ = heads["tiny/BF16"]
    r = CudaRunner(ck, 512, "bf16")
    prompt = [int(t) for t in rng.integers(0, 4096, 17)]
    r.prefill(prompt, 0)
    H = r.last_hidden()
    history = prompt + [int(rng.integers(0, 4096))]  # the token after the prompt: its input row is the last
    for k in range(1, MAX_K + 1):
        assert r.mtp_draft(history[1:], H, 0, k, sp, 11, history) == _host_chain(r, history, H, k, sp), k


def test_spec_mtp_identical_with_a_head_that_copies_the_trunk(cp, tmp_path):
    """--spec mtp on CUDA = plain decoding, K = 1..8, greedy and sampled; the head (the trunk's own
    layer and LM head, tests/test_mtp.py) is accepted most of the time."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.loaders import load_checkpoint
    from tests.model_factory import make_hf_dir
    from tests.test_mtp import _copy_trunk, _identical

    d, _ = make_hf_dir(tmp_path / "m", "glm4_moe", dtype="BF16", num_hidden_layers=1, first_k_dense_replace=0,
                       num_nextn_predict_layers=1, head_dim=32, edit=_copy_trunk)
    ck = load_checkpoint(d)
    runner = CudaRunner(ck, 256, "f32")
    stats = _identical(runner, replace(ck.tokenizer, stop_ids=set()), range(1, MAX_K + 1),
                       [[5, 77, 120, 3, 9, 200, 31], [1, 2, 3]], n_gen=40)
    for mode, k, s in stats:
        print(f"{mode:8} K={k}  acceptance {s['spec_acceptance']:.2f}  tokens/round {s['spec_mean_len']:.2f}")
    # the NumPy backend on this model (bf16 weights): greedy 1.00; sampled 0.81-0.90 (K = 1) .. 0.52 (K = 8)
    assert all(s["spec_acceptance"] > (0.9 if mode == "greedy" else 0.3) for mode, _, s in stats)


def _reduced(ck, n: int, seed: int = 5):
    """``ck`` with its MTP head drafting over n random token ids (the trunk's LM head rows of those
    ids, as loading a trained head's draft_vocab gathers them)."""
    from bw24chat.loaders.draft_head import draft_vocab_tensors
    from bw24chat.loaders.tensor import QTensor

    V, L = ck.config["vocab_size"], ck.config["num_hidden_layers"]
    ids = np.sort(np.random.default_rng(seed).choice(V, n, replace=False)).astype(np.int32)
    vocab = QTensor(f"blk.{L}.nextn.draft_vocab", "I32", ids.shape, ids)
    return replace(ck, mtp={**ck.mtp, **draft_vocab_tensors(ck, None, vocab)}), ids


@pytest.mark.parametrize("T,n,V", [(1, 1000, 4096), (3, 37, 1001), (2, 8192, 49152)])
def test_vocab_expand_equals_its_reference(cp, T, n, V, rng):
    from bw24chat.backends import cuda_ops
    from bw24chat.backends.numpy_backend import vocab_expand_ref, vocab_map_ref

    vmap = vocab_map_ref(np.sort(rng.choice(V, n, replace=False)), V)
    sub = rng.standard_normal((T, n)).astype(np.float32)
    out = cp.full((T, V), 7.0, cp.float32)
    cuda_ops.vocab_expand(cp.asarray(sub), cp.asarray(vmap), out)
    want = vocab_expand_ref(sub, vmap)
    assert np.array_equal(cp.asnumpy(out).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", ["tiny/BF16", "tiny/Q8_0"])
def test_reduced_vocabulary_head_equals_the_numpy_head(cp, heads, name, rng):
    """The head's draft logits over its vocabulary (-inf elsewhere) and g against NumPy's; the
    drafts are the argmax over the gathered rows, mapped back to token ids."""
    ck, aq = heads[name]
    ck, ids = _reduced(ck, 1000)
    cu, ref, prompt, H = _prefilled(ck, aq, rng)
    assert cu.mtp.vocab_map is not None
    V = ck.config["vocab_size"]
    want = ref.mtp_forward(prompt[1:], H[:-1], 0, True)
    got = cu.mtp_forward(prompt[1:], H[:-1], 0, True)
    tol = 5e-4 if aq else 1e-4
    outside = np.setdiff1d(np.arange(V), ids)
    for j in range(4):
        assert np.isneginf(got[0][outside]).all() and np.isfinite(got[0][ids]).all()
        assert _rel(got[0][ids], want[0][ids]) < tol and _rel(got[1], want[1]) < tol, j
        t = int(ids[np.argmax(want[0][ids])])
        assert t == int(np.argmax(want[0]))
        g = want[1]
        want = ref.mtp_forward([t], g[None], len(prompt) - 1 + j, False)
        got = cu.mtp_forward([t], g[None], len(prompt) - 1 + j, False)


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0), SAMPLED], ids=["greedy", "sampled"])
def test_reduced_vocabulary_chain_equals_the_host_loop(cp, heads, sp, rng):
    """As test_device_chain_equals_the_host_loop, the sampler drawing over the expanded logits."""
    from bw24chat.backends.cuda_runner import CudaRunner

    ck, ids = _reduced(heads["tiny/BF16"][0], 600)
    r = CudaRunner(ck, 512, "bf16")
    prompt = [int(t) for t in rng.choice(ids, 17)]  # tokens of the vocabulary: the penalty's ring meets them
    r.prefill(prompt, 0)
    H = r.last_hidden()
    history = prompt + [int(rng.choice(ids))]
    for k in range(1, MAX_K + 1):
        got = r.mtp_draft(history[1:], H, 0, k, sp, 11, history)
        assert got == _host_chain(r, history, H, k, sp) and set(got) <= set(ids.tolist()), k


def test_spec_mtp_identical_with_a_reduced_vocabulary_head(cp, tmp_path):
    """--spec mtp on CUDA = plain decoding, K = 1..8, greedy and sampled, the head (copying the
    trunk) drafting over half the vocabulary: drafts outside it are never proposed."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.loaders import load_checkpoint
    from tests.model_factory import make_hf_dir
    from tests.test_mtp import _copy_trunk, _identical

    d, _ = make_hf_dir(tmp_path / "m", "glm4_moe", dtype="BF16", num_hidden_layers=1, first_k_dense_replace=0,
                       num_nextn_predict_layers=1, head_dim=32, edit=_copy_trunk)
    ck = load_checkpoint(d)
    ck, _ = _reduced(ck, ck.config["vocab_size"] // 2)
    runner = CudaRunner(ck, 256, "f32")
    stats = _identical(runner, replace(ck.tokenizer, stop_ids=set()), range(1, MAX_K + 1),
                       [[5, 77, 120, 3, 9, 200, 31], [1, 2, 3]], n_gen=40)
    for mode, k, s in stats:
        print(f"{mode:8} K={k}  acceptance {s['spec_acceptance']:.2f}  tokens/round {s['spec_mean_len']:.2f}")
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)
