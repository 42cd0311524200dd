"""bw24chat train-draft (train_draft.py) and the PyTorch backend it trains on
(backends/torch_backend.py), on tiny random models: the model files' blocks give the NumPy
backend's logits there; the rows training computes are the rows speculative.MTPDrafter computes
(the chained rows included); a few steps lower the loss, a cancelled run resumes to the same head,
and the saved head drives --spec mtp with output equal to plain decoding.  Skipped without torch
(the optional [train] extra)."""
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bw24chat.backends.numpy_backend import numpy_runner  # noqa: E402
from bw24chat.backends.torch_backend import PassKV, TorchKVCache, TorchOps  # noqa: E402
from bw24chat.loaders import load_checkpoint  # noqa: E402
from bw24chat.loaders.draft_head import head_path, read_head  # noqa: E402
from bw24chat.loaders.tensor import QTensor  # noqa: E402
from bw24chat.train_draft import DraftTrainer, TrainCancelled, TrainConfig, resume_path, train_draft  # noqa: E402
from .model_factory import make_gguf, make_hf_dir  # noqa: E402
from .test_mtp import _identical  # noqa: E402

TINY = TrainConfig(steps=6, batch=4, depth=3, gen_tokens=12, samples=1, max_len=96, eval_every=3, save_every=2,
                   loss_chunk=64, lr=3e-3, warmup=1)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "llama-gguf"])
def test_the_model_files_run_on_torch_as_on_numpy(tmp_path, family):
    """The HF folders rotate the "neox" pairs; a llama GGUF (Q4_1) the "normal" ones."""
    if family == "llama-gguf":
        ckpt = load_checkpoint(make_gguf(tmp_path / "m.gguf"))
    else:
        ckpt = load_checkpoint(make_hf_dir(tmp_path / family, family, dtype="F32")[0])
    tr = DraftTrainer(ckpt, TINY, "cpu")
    seqs = [[5, 77, 120, 3, 9, 200, 31, 8], [1, 2, 3], [40, 41, 42, 43, 44]]
    want = [numpy_runner(ckpt, 64).prefill_logits(np.array(s), 0) for s in seqs]
    # a training pass: whole sequences, right-padded
    L = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    ops = TorchOps(tr.tb, tr.eps, kv=PassKV())
    got = tr.trunk.logits(ops, tr.trunk.trunk(ops, ids)).logits(tr.tb)
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(got[i, :len(s)].numpy(), want[i], rtol=1e-4, atol=1e-4)
    # a generation pass: left-padded prompts in a cache, then one more token each
    pad = torch.tensor([L - len(s) for s in seqs])
    cache = TorchKVCache(tr.tb, tr.args.num_hidden_layers, pad, L + 1, tr.args.num_key_value_heads, tr.args.head_dim)
    ids = torch.tensor([[0] * (L - len(s)) + s[:-1] + [s[-1]] for s in seqs])
    h = tr.trunk.trunk(TorchOps(tr.tb, tr.eps, cache=cache, start=0), ids)
    ops = TorchOps(tr.tb, tr.eps, cache=cache, start=L)
    nxt = tr.trunk.logits(ops, tr.trunk.trunk(ops, torch.tensor([[7], [7], [7]]))).logits(tr.tb)[:, 0]
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(tr.trunk.logits(ops, h[i:i + 1, -1:]).logits(tr.tb)[0, 0].numpy(), want[i][-1],
                                   rtol=1e-4, atol=1e-4)
        ref = numpy_runner(ckpt, 64).prefill_logits(np.array(s + [7]), 0)[-1]
        np.testing.assert_allclose(nxt[i].numpy(), ref, rtol=1e-4, atol=1e-4)


def test_the_rows_trained_are_the_rows_the_drafter_runs(tmp_path):
    """Depth d, row s of a training pass = the drafter's d-th chained row after trunk row s (its
    cache holding the head's rows 0..s and its own chain), token inputs as the text has them."""
    d, _ = make_hf_dir(tmp_path / "m", "qwen3", dtype="F32")
    ckpt = load_checkpoint(d)
    tr = DraftTrainer(ckpt, TINY, "cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tr.params:  # away from the starting point, so that every weight matters
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    ckpt.mtp = {n: QTensor(n, "F32", a.shape, a) for n, a in tr.hb.unfuse().items()}
    ckpt.config["num_nextn_predict_layers"] = 1
    runner = numpy_runner(ckpt, 64)
    x = [5, 77, 120, 3, 9, 200, 31, 8, 44, 61, 2]
    tokens, lengths, H = tr.hidden([x])
    with torch.no_grad():
        rows = tr.head_rows(tokens, H, lengths)
        student = [tr.tb_linear(xs[0], tr.trunk.output).numpy() for xs, _, _ in rows]
    runner.prefill(x, 0)
    hid = runner.last_hidden()
    for s in (0, 3, 6):
        logits, gv = runner.mtp_forward(x[1:s + 2], hid[:s + 1], 0, True)
        np.testing.assert_allclose(student[0][s], logits, rtol=1e-4, atol=1e-4)
        for depth in (1, 2):  # the chain: the text's next token with the row's own g
            logits, gv = runner.mtp_forward([x[s + depth + 1]], gv[None], s + depth, False)
            np.testing.assert_allclose(student[depth][s], logits, rtol=1e-4, atol=1e-4)


def test_training_lowers_the_loss_resumes_and_the_head_passes_the_gate(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", dtype="F32")
    ckpt = load_checkpoint(d)
    tr = DraftTrainer(ckpt, TINY, "cpu")
    tokens, lengths, H = tr.hidden(tr.generate(tr.prompt_ids(["Hello, how are you?", "Write a poem."]), [True, False], 0))

    def fixed_loss():
        with torch.no_grad():
            return float(tr.loss(tokens, H, lengths))

    before = fixed_loss()
    full = tr.run(tmp_path / "full.safetensors")
    assert fixed_loss() < before
    assert full.steps == 6 and full.texts == 133 and full.peak_gpu_bytes is None
    assert 1.0 <= full.heldout["mean_len"] <= 4.0 and len(full.heldout["accept"]) == 3 and full.train

    # cancelled after step 3 (its state saved at step 2 and again at the cancel), then resumed
    out = head_path(d)
    cancel = threading.Event()
    progress = lambda p: cancel.set() if p.stage == "training" and p.done == 3 else None  # noqa: E731
    with pytest.raises(TrainCancelled):
        train_draft(load_checkpoint(d), out, TINY, "cpu", progress=progress, cancel=cancel)
    assert resume_path(out).exists() and not out.exists()
    res = train_draft(load_checkpoint(d), out, TINY, "cpu", resume=True)
    assert res.generate_s == 0 and not resume_path(out).exists()
    (_, resumed), (_, uninterrupted) = read_head(out), read_head(tmp_path / "full.safetensors")
    for name, t in resumed.items():
        assert t.fmt == uninterrupted[name].fmt and np.array_equal(t.raw, uninterrupted[name].raw), name  # the vocab map is I32

    # found beside the model; --spec mtp = plain decoding
    ckpt = load_checkpoint(d)
    assert ckpt.draft_head == out
    runner = numpy_runner(ckpt, 256)
    tok = ckpt.tokenizer
    stats = _identical(runner, tok, (1, 3, 8), [tok.encode("The weather today is")], n_gen=16)
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)
