"""The NextN / MTP head (models/mtp.py, speculative.MTPDrafter) on the NumPy backend: a tiny
GLM-4.5-style model carrying a NextN layer in HF and in GGUF naming; the pairing (embedding of
token t+1, trunk hidden at t) checked against a direct computation; --spec mtp token-identical
to plain decoding; a head built to copy the trunk accepted most of the time (the wiring).  The
Qwen3-Next / Qwen3.5 ``mtp.*`` heads on hybrid models: loading, pairing and normed chaining
against a direct computation, --spec mtp token-identical for K = 1..8."""
from dataclasses import replace

import numpy as np
import pytest

from bw24chat import check
from bw24chat.api import SamplingParams
from bw24chat.backends.numpy_backend import NumpyRunner, numpy_runner, rmsnorm_ref
from bw24chat.generate import Generator
from bw24chat.loaders import load_checkpoint
from bw24chat.speculative import MAX_K, MTPDrafter, make_drafter
from .hybrid_factory import make_hybrid_dir
from .model_factory import make_hf_dir, write_gguf

N_CTX = 256


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm_mtp")
    d, w = make_hf_dir(root / "hf", "glm4_moe", dtype="F32", num_nextn_predict_layers=1)
    gguf = write_gguf(root / "glm.gguf", d, w)
    ckpt = load_checkpoint(d)
    return ckpt, load_checkpoint(gguf), w, numpy_runner(ckpt, N_CTX)



def _propose_spied(runner, prompt, history, k):
    """MTPDrafter.propose(history, k) after ``prompt``'s prefill, with every runner.mtp_forward
    call recorded as (ids, hidden, start, from_trunk, logits)."""
    calls, real = [], runner.mtp_forward

    def spy(ids, hidden, start, from_trunk):
        res = real(ids, hidden, start, from_trunk)
        calls.append((list(ids), np.array(hidden), start, from_trunk, res[0].copy()))
        return res

    d = MTPDrafter(runner)
    d.begin(prompt)
    d.prime(runner.last_hidden(), None, 0)
    runner.mtp_forward = spy
    try:
        return d.propose(history, k), calls
    finally:
        del runner.mtp_forward

def test_nextn_layer_loads_apart_from_the_trunk(glm):
    hf, gg, _, runner = glm
    n = hf.config["num_hidden_layers"]
    for ck in (hf, gg):
        assert ck.config["num_hidden_layers"] == n and ck.config["num_nextn_predict_layers"] == 1
        assert not any(k.startswith(f"blk.{n}.") for k in ck.tensors)
        assert {f"blk.{n}.nextn.{k}" for k in ("eh_proj", "enorm", "hnorm", "shared_head_norm", "shared_head_head")} <= set(ck.mtp)
        assert f"blk.{n}.ffn_gate_exps" in ck.mtp and f"blk.{n}.attn_q" in ck.mtp  # the layer's own (MoE) block
    assert sorted(hf.mtp) == sorted(gg.mtp)
    assert runner.mtp is not None and runner.mtp.layer.moe is not None


def test_hf_and_gguf_heads_agree(glm):
    hf, gg, _, r1 = glm
    r2 = numpy_runner(gg, N_CTX)
    ids = [5, 77, 120, 3, 9, 200]
    out = []
    for r in (r1, r2):
        r.prefill(ids, 0)
        out.append(r.mtp_forward(ids[1:], r.last_hidden()[:-1], 0, True))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5, atol=1e-5)


def test_first_draft_pairs_token_t_plus_1_with_hidden_t(glm):
    """The drafter's first draft after a prefill, against the head computed here from the weights:
    row t = eh_proj @ [enorm(emb(t+1)), hnorm(final_norm(h_t))], h_t the trunk's pre-norm output
    at t (a fresh trunk pass over the whole history), the head's block, shared_head norm and head."""
    _, _, w, runner = glm
    n = runner.args.num_hidden_layers
    eps = runner.args.rms_norm_eps
    prompt = [11, 42, 7, 99, 150, 3, 64]
    first = runner.prefill(prompt, 0, SamplingParams(temperature=0), 0, [])
    history = prompt + [first]
    draft, calls = _propose_spied(runner, prompt, history, 1)
    ids, _, start, from_trunk, logits = calls[0]
    assert (ids, start, from_trunk) == (history[1:], 0, True)

    # direct: the trunk's pre-norm hidden states of the history, in a fresh cache
    fresh = NumpyRunner(runner.model, runner.backend)
    fresh.forward(history, 0)
    H = fresh.last_hidden()[:-1]  # h_0 .. h_{L-2}
    p = f"model.layers.{n}."
    e = w["model.embed_tokens.weight"][history[1:]]  # emb(t+1) for t = 0 .. L-2
    hn = rmsnorm_ref(rmsnorm_ref(H, w["model.norm.weight"], eps), w[p + "hnorm.weight"], eps)
    x = np.concatenate([rmsnorm_ref(e, w[p + "enorm.weight"], eps), hn], axis=1) @ w[p + "eh_proj.weight"].T
    ops = runner.backend.ops(runner.backend.new_kv_cache(1, runner.args.num_key_value_heads, runner.args.head_dim, N_CTX),
                             0, len(x), eps)
    g = runner.model.block(ops, 0, runner.mtp.layer, x)
    want = rmsnorm_ref(g[-1:], w[p + "shared_head.norm.weight"], eps) @ w[p + "shared_head.head.weight"].T
    np.testing.assert_allclose(logits, want[0], rtol=1e-4, atol=1e-4)
    assert draft == [int(np.argmax(want[0]))]
    # the off-by-one pairing (h_{t+1} with token t+1) gives other logits: the check can see it
    fresh.forward(history + [1], 0)
    x_off = np.concatenate([rmsnorm_ref(e, w[p + "enorm.weight"], eps),
                            rmsnorm_ref(rmsnorm_ref(fresh.last_hidden()[1:-1], w["model.norm.weight"], eps),
                                        w[p + "hnorm.weight"], eps)], axis=1) @ w[p + "eh_proj.weight"].T
    ops = runner.backend.ops(runner.backend.new_kv_cache(1, runner.args.num_key_value_heads, runner.args.head_dim, N_CTX),
                             0, len(x), eps)
    off = rmsnorm_ref(runner.model.block(ops, 0, runner.mtp.layer, x_off)[-1:], w[p + "shared_head.norm.weight"], eps) \
        @ w[p + "shared_head.head.weight"].T
    assert np.abs(off[0] - logits).max() > 1e-2


def _identical(runner, tok, ks, prompts, n_gen=24):
    """--spec mtp = plain decoding (tokens, text, finish, and the cache left: probe logits)."""
    stats = []
    for prompt in prompts:
        case = check.SpecCase("p", prompt, n_gen)
        for mode, sp in check.SPEC_SAMPLING.items():
            plain, _, probe = check._generate(runner, tok, case, sp, [], set(tok.stop_ids))
            for k in ks:
                res, _, probe2 = check._generate(runner, tok, case, sp, [], set(tok.stop_ids), make_drafter("mtp", runner), k)
                assert res.token_ids == plain.token_ids, (mode, k)
                assert (res.text, res.finish_reason) == (plain.text, plain.finish_reason)
                assert np.array_equal(probe.view(np.uint32), probe2.view(np.uint32)), (mode, k)
                stats.append((mode, k, res.stats))
    return stats


def test_spec_mtp_token_identical_for_every_k(glm):
    hf, _, _, runner = glm
    tok = replace(hf.tokenizer, stop_ids=set())
    stats = _identical(runner, tok, range(1, MAX_K + 1), [[5, 77, 120, 3, 9, 200, 31], [1, 2, 3]])
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)


def test_spec_mtp_refused_without_a_head(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "glm4_moe", dtype="F32")
    with pytest.raises(ValueError, match="multi-token-prediction head"):
        make_drafter("mtp", numpy_runner(load_checkpoint(d), 64))


def _copy_trunk(w):
    """A head that computes the trunk's own next-token prediction: its block is the trunk's only
    layer, eh_proj passes the (unit-RMS) embedding through and drops h, shared_head = the trunk's
    final norm and LM head; weak attention, so the context the head's cache lacks matters little."""
    emb = w["model.embed_tokens.weight"]
    emb /= np.sqrt(np.mean(emb * emb, axis=1, keepdims=True))  # enorm(emb) = emb (weight 1)
    D = emb.shape[1]
    w["model.layers.0.self_attn.o_proj.weight"] *= 0.1
    for name in [k for k in w if k.startswith("model.layers.0.")]:
        w[name.replace("model.layers.0.", "model.layers.1.")] = w[name].copy()
    w["model.layers.1.eh_proj.weight"] = np.concatenate([np.eye(D), np.zeros((D, D))], axis=1).astype(np.float32)
    w["model.layers.1.enorm.weight"] = np.ones(D, np.float32)
    w["model.layers.1.hnorm.weight"] = np.zeros(D, np.float32)
    w["model.layers.1.shared_head.norm.weight"] = w["model.norm.weight"].copy()
    w["model.layers.1.shared_head.head.weight"] = w["lm_head.weight"].copy()


def test_a_head_that_copies_the_trunk_is_accepted(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "glm4_moe", dtype="F32", num_hidden_layers=1, first_k_dense_replace=0,
                       num_nextn_predict_layers=1, edit=_copy_trunk)
    ckpt = load_checkpoint(d)
    runner = numpy_runner(ckpt, N_CTX)
    tok = replace(ckpt.tokenizer, stop_ids=set())
    stats = _identical(runner, tok, (1, 4), [[5, 77, 120, 3, 9, 200, 31]], n_gen=32)
    for mode, k, s in stats:
        assert s["spec_acceptance"] > 0.8, (mode, k, s)


@pytest.mark.kernels  # the plan reads register counts from ptxas (NVRTC)
@pytest.mark.parametrize("m,from_trunk", [(1, True), (5, True), (1, False)])
def test_cuda_head_pass_planned(m, from_trunk):
    """The CUDA head's decode pass (cuda_mtp._HeadOps) traced without a GPU, as the decode plan
    traces the trunk's step (backends/plan.py): the embedding, the trunk's final norm of h (catch-up
    rows only), ONE launch for the concat of both normed halves, eh_proj as one matvec over 2D
    inputs, the block's six launches over the head's own cache, the LM head on the last row only;
    nothing written to the trunk's buffers."""
    from bw24chat.backends import cuda_ops
    from bw24chat.backends import plan as P
    from bw24chat.backends.cuda_mtp import _HeadOps
    from bw24chat.models import get_family
    from bw24chat.models.mtp import load_mtp
    from bw24chat.synthetic import SHAPES

    cfg = dict(SHAPES["tiny"], num_nextn_predict_layers=1)
    fam = get_family(cfg["model_type"])
    a = fam.ModelArgs.from_dict(cfg)
    D = a.hidden_size
    with P.planning(P.GPUS["H100"]) as planner:
        r = P.PlanRunner(a, fam.Model, P._tensors(cfg, {"default": "Q8_0"}, fam.Model, a), "bf16", 4096, "f32")
        head = load_mtp(r.model, P.PlanLoader(), {n: P._Tensor(n, "F32" if len(shape) == 1 else "Q8_0", shape)
                                                  for n, (shape, req) in fam.Model.mtp_tensor_shapes(a, 1).items()
                                                  if req or n.endswith(("q_norm", "k_norm"))})
        shape, dtype = cuda_ops.kv_cache_shape("bf16", 4096, a.num_key_value_heads, a.head_dim)
        cache = P.SymArray("mtp_k", shape, dtype), P.SymArray("mtp_v", shape, dtype)
        mtp_logits = P.SymArray("mtp_logits", (1, a.vocab_size), np.float32)
        io, hidden = P.SymArray("io", (24,), np.int32), P.SymArray("hidden", (8, D), np.float32)
        ops = _HeadOps(r, m, io[0:m], io[8:8 + m], io[16:16 + m], cache, mtp_logits)
        logits, g = head.forward(ops, ops.tokens, hidden[:m], from_trunk)
    L = planner.launches
    names = [x.name for x in L]
    mv = "matvec_mma" if m > 1 else "matvec"  # the m-row matvecs (cuda_linear.matvec_impl); the LM head takes one row
    lead = ["dequant_rows"] + (["rmsnorm"] if from_trunk else []) + ["rmsnorm_concat", mv]
    assert names == lead + [mv, "qk_norm_rope_kv_write", "attn_decode_tc", mv, mv, mv, "matvec"]
    concat = L[len(lead) - 2]
    assert concat.grid == (m, 2) and concat.args[3] == ("mtp.hn" if from_trunk else "hidden")
    assert L[len(lead) - 1].args[5] == "mtp.concat" and "blk.3.nextn.eh_proj.q" in L[len(lead) - 1].args
    assert {"mtp_k", "mtp_v"} <= set(L[len(lead) + 1].args) and {"mtp_k", "mtp_v"} <= set(L[len(lead) + 2].args)
    assert L[-1].args[5] == "mtp.mtp_eh_proj" + (f"+{(m - 1) * D * 4}" if m > 1 else "")  # the LM head: the last row
    assert logits is mtp_logits and g.shape == (m, D)
    trunk = {"x", "h", "qkv", "q", "attn", "act", "logits"}  # the trunk's step buffers
    assert not any(arg.split("+")[0] in trunk for x in L for arg in x.args), "the head wrote the trunk's buffers"


# ----------------------------------------------------------------------------- Qwen3-Next / Qwen3.5 heads
@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5"])
def hybrid(request, tmp_path_factory):
    d, w = make_hybrid_dir(tmp_path_factory.mktemp(request.param), request.param, n_mtp=1)
    ck = load_checkpoint(d)
    return ck, w, numpy_runner(ck, N_CTX)


def test_qwen_mtp_head_loads_as_a_nextn_layer(hybrid):
    """mtp.fc / pre_fc_norm_* / norm / layers.0 -> NextN layer N (a full-attention layer; Qwen3-Next's
    with MoE), with the trunk's embedding and LM head."""
    ck, _, runner = hybrid
    n = ck.config["num_hidden_layers"]
    assert ck.config["num_nextn_predict_layers"] == 1 and not any(k.startswith(f"blk.{n}.") for k in ck.tensors)
    assert {f"blk.{n}.nextn.{k}" for k in ("eh_proj", "enorm", "hnorm", "shared_head_norm")} <= set(ck.mtp)
    assert f"blk.{n}.attn_q" in ck.mtp and f"blk.{n}.attn_qkv" not in ck.mtp
    m = runner.mtp
    assert m.layer.deltanet is None and (m.layer.moe is not None) == (ck.arch == "qwen3_next")
    assert m.head is runner.model.output and m.embd is runner.model.tok_embd


def test_qwen_mtp_drafts_pair_and_chain_the_normed_output(hybrid):
    """The first two drafts against the head computed here from transformers' weights (every norm
    zero-centred: 1 + w): row t = fc @ [norm_e(emb(t+1)), norm_h(final_norm(h_t))], the layer,
    logits = lm_head(norm(g)); the chained row takes norm(g) (vLLM qwen3_next_mtp.py), not g."""
    ck, w, runner = hybrid
    eps, L0 = runner.args.rms_norm_eps, ck.config["num_hidden_layers"]
    zc = lambda name: np.float32(1) + w[name]  # noqa: E731
    rms = lambda x, name: rmsnorm_ref(x, zc(name), eps)  # noqa: E731
    prompt = [11, 42, 7, 99, 150, 3, 64, 200, 17]
    first = runner.prefill(prompt, 0, SamplingParams(temperature=0), 0, [])
    history = prompt + [first]
    drafts, spied = _propose_spied(runner, prompt, history, 2)
    calls = [c[-1] for c in spied]

    fresh = NumpyRunner(runner.model, runner.backend)
    fresh.forward(history, 0)
    H = fresh.last_hidden()[:-1]  # h_0 .. h_{L-2}, pre-norm
    emb, head, fc = w["model.embed_tokens.weight"], w["lm_head.weight"], w["mtp.fc.weight"]
    b, a = runner.backend, runner.args
    cache = b.new_kv_cache(1, a.num_key_value_heads, a.head_dim, N_CTX)
    x = np.concatenate([rms(emb[history[1:]], "mtp.pre_fc_norm_embedding.weight"),
                        rms(rms(H, "model.norm.weight"), "mtp.pre_fc_norm_hidden.weight")], axis=1) @ fc.T
    g = runner.model.block(b.ops(cache, 0, len(x), eps), 0, runner.mtp.layer, x)[-1:]
    n1 = rms(g, "mtp.norm.weight")
    want1 = (n1 @ head.T)[0]
    np.testing.assert_allclose(calls[0], want1, rtol=1e-4, atol=1e-4)
    assert drafts[0] == int(np.argmax(want1))

    def chained(h):  # the row (draft 0, h) at position L - 1
        x2 = np.concatenate([rms(emb[drafts[:1]], "mtp.pre_fc_norm_embedding.weight"),
                             rms(h, "mtp.pre_fc_norm_hidden.weight")], axis=1) @ fc.T
        g2 = runner.model.block(b.ops(cache, len(history) - 1, 1, eps), 0, runner.mtp.layer, x2)
        return (rms(g2, "mtp.norm.weight") @ head.T)[0]

    want2 = chained(n1)
    np.testing.assert_allclose(calls[1], want2, rtol=1e-4, atol=1e-4)
    assert drafts[1] == int(np.argmax(want2)) and L0 == runner.mtp.layer_index
    assert np.abs(chained(g) - want2).max() > 1e-3  # chaining g itself would be visible


def test_qwen_spec_mtp_token_identical_for_every_k(hybrid):
    ck, _, runner = hybrid
    tok = replace(ck.tokenizer, stop_ids=set())
    stats = _identical(runner, tok, range(1, MAX_K + 1), [[5, 77, 120, 3, 9, 200, 31]])
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)
