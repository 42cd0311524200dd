"""Trained draft heads (loaders/draft_head.py) without PyTorch: a head file written beside a model
is found when the model loads, drives --spec mtp on the NumPy backend with output equal to plain
decoding, and a head trained for another trunk is refused with a message that says so."""
import shutil

import numpy as np
import pytest

from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.loaders import ModelFileError, load_checkpoint
from bw24chat.loaders.draft_head import head_path, read_head, trunk_sha256, write_head
from bw24chat.models import get_family
from bw24chat.train_draft import initial_head_tensors
from .model_factory import make_gguf, make_hf_dir
from .test_mtp import _identical


def write_test_head(ckpt, path=None, seed=0, vocab=None) -> dict:
    """A head for ``ckpt`` as train-draft writes one: its starting point, moved at random (so
    that both halves of eh_proj matter), under the canonical names."""
    rng = np.random.default_rng(seed)
    args = get_family(ckpt.arch).ModelArgs.from_dict(ckpt.config)
    tensors = {n: t.dequantize() + 0.02 * rng.standard_normal(t.shape).astype(np.float32)
               for n, t in initial_head_tensors(ckpt, args).items()}
    if vocab is not None:  # a reduced draft vocabulary (FR-Spec)
        tensors[f"blk.{args.num_hidden_layers}.nextn.draft_vocab"] = np.asarray(vocab, np.int32)
    write_head(path or head_path(ckpt.path), tensors, {"trunk_sha256": trunk_sha256(ckpt), "arch": ckpt.arch})
    return tensors


def test_a_head_beside_a_gguf_is_found_and_speculation_equals_plain_decoding(tmp_path):
    gguf = make_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(gguf)
    assert ckpt.draft_head is None and not ckpt.mtp
    written = write_test_head(ckpt)
    assert head_path(gguf) == tmp_path / "tiny.draft-head.safetensors"
    ckpt = load_checkpoint(gguf)
    assert ckpt.draft_head == head_path(gguf) and ckpt.draft_head_problem is None
    assert ckpt.config["num_nextn_predict_layers"] == 1
    n = ckpt.config["num_hidden_layers"]
    assert set(ckpt.mtp) == set(written) and f"blk.{n}.nextn.eh_proj" in ckpt.mtp
    # matrices are stored as bf16, vectors as float32
    np.testing.assert_allclose(ckpt.mtp[f"blk.{n}.attn_q"].dequantize(), written[f"blk.{n}.attn_q"], rtol=1e-2, atol=1e-3)
    assert np.array_equal(ckpt.mtp[f"blk.{n}.nextn.hnorm"].dequantize(), written[f"blk.{n}.nextn.hnorm"])
    runner = numpy_runner(ckpt, 256)
    assert runner.mtp is not None and runner.mtp.head is runner.model.output  # the LM head is the trunk's
    tok = ckpt.tokenizer
    stats = _identical(runner, tok, (1, 3, 8), [tok.encode("hello there, how are you")], n_gen=20)
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)


def test_a_head_inside_a_model_folder_is_not_read_as_a_weight_shard(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "qwen3", dtype="F32")
    write_test_head(load_checkpoint(d))
    assert (d / "draft-head.safetensors").is_file()
    ckpt = load_checkpoint(d)
    assert ckpt.draft_head == d / "draft-head.safetensors"
    assert not any(n.startswith(f"blk.{ckpt.config['num_hidden_layers']}.") for n in ckpt.tensors)
    assert numpy_runner(ckpt, 64).mtp is not None


def test_a_head_for_another_trunk_is_refused(tmp_path):
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions

    mine = make_gguf(tmp_path / "a" / "mine.gguf", seed=0)
    other = make_gguf(tmp_path / "b" / "other.gguf", seed=1)  # same shape, other weights
    write_test_head(load_checkpoint(mine))
    shutil.copy(head_path(mine), head_path(other))
    ckpt = load_checkpoint(other)  # found beside the model: left out, the model still loads
    assert not ckpt.mtp and ckpt.draft_head is None
    assert "trained for another model" in ckpt.draft_head_problem
    with pytest.raises(ModelFileError, match="trained for another model"):  # named explicitly: refused
        load_checkpoint(other, draft_head=head_path(mine))
    with pytest.raises(ValueError, match="trained for another model"):  # --spec mtp says why there is no head
        open_engine(EngineOptions(model=str(other), device="cpu", spec="mtp"))


def test_draft_head_flag_names_the_file_and_turns_mtp_on(tmp_path):
    from bw24chat.cli import build_parser
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions, options_from_args

    o = options_from_args(build_parser().parse_args(["--draft-head", "h.safetensors"]))
    assert (o.spec, o.draft_head) == ("mtp", "h.safetensors")
    assert options_from_args(build_parser().parse_args(["--draft-head", "h", "--spec", "ngram"])).spec == "ngram"
    assert options_from_args(build_parser().parse_args([])).spec == "off"
    gguf = make_gguf(tmp_path / "m.gguf")
    elsewhere = tmp_path / "heads" / "mine.safetensors"
    write_test_head(load_checkpoint(gguf), elsewhere)
    engine = open_engine(EngineOptions(model=str(gguf), device="cpu", spec="mtp", draft_head=str(elsewhere)))
    try:
        assert engine.checkpoint.draft_head == elsewhere and engine.runner.mtp is not None
    finally:
        engine.close()
    with pytest.raises(ModelFileError, match="no such draft head"):
        load_checkpoint(gguf, draft_head=tmp_path / "missing.safetensors")


def test_a_file_that_is_not_a_head_is_refused(tmp_path):
    from bw24chat.loaders.hf_loader import write_safetensors

    gguf = make_gguf(tmp_path / "m.gguf")
    write_safetensors(head_path(gguf), {"x": ("F32", np.zeros(4, np.float32))})
    with pytest.raises(ModelFileError, match="not a bw24chat draft head"):
        load_checkpoint(gguf, draft_head=head_path(gguf))
    assert "not a bw24chat draft head" in load_checkpoint(gguf).draft_head_problem
    ckpt = load_checkpoint(gguf)
    tensors = write_test_head(ckpt)
    info, read = read_head(head_path(gguf))
    n = ckpt.config["num_hidden_layers"]
    del tensors[f"blk.{n}.ffn_down"]  # a head without its layer's down projection
    write_head(head_path(gguf), tensors, info)
    with pytest.raises(ModelFileError, match="ffn_down"):
        load_checkpoint(gguf, draft_head=head_path(gguf))


def test_the_trunk_digest_is_of_the_weights_and_cached(tmp_path, monkeypatch):
    a, b = make_gguf(tmp_path / "a.gguf", seed=0), make_gguf(tmp_path / "b.gguf", seed=0)
    c = make_gguf(tmp_path / "c.gguf", seed=2)
    ca, cb, cc = (load_checkpoint(p) for p in (a, b, c))
    assert trunk_sha256(ca) == trunk_sha256(cb) != trunk_sha256(cc)  # the same weights in two files: one digest
    import bw24chat.loaders.draft_head as dh

    monkeypatch.setattr(dh.hashlib, "sha256", lambda: pytest.fail("hashed again"))
    assert trunk_sha256(load_checkpoint(a)) == trunk_sha256(ca)


def test_without_torch_the_command_says_how_to_get_it(monkeypatch, capsys):
    import builtins

    from bw24chat.train_draft import main

    real = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert main(["-m", "default"]) == 2
    assert "pip install 'bw24chat[train]'" in capsys.readouterr().err


def test_check_spec_gates_a_model_with_its_trained_head(tmp_path, capsys):
    from bw24chat import check

    gguf = make_gguf(tmp_path / "m.gguf", max_position_embeddings=2048)
    write_test_head(load_checkpoint(gguf))
    assert check.main(["--spec", "-m", str(gguf), "--device", "cpu", "--spec-k", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "MTP head m.draft-head.safetensors" in out
    mtp = [line for line in out.splitlines() if " mtp " in line]
    assert len(mtp) == 4 and all(line.startswith("PASS") for line in mtp)  # greedy and sampled, K = 1 and 4
    assert "FAIL" not in out


def _vocab(ckpt, n, seed=3):
    V = ckpt.config["vocab_size"]
    return np.sort(np.random.default_rng(seed).choice(V, size=n, replace=False)).astype(np.int32)


def test_a_reduced_vocabulary_head_round_trips_and_drafts_the_argmax_over_its_rows(tmp_path):
    gguf = make_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(gguf)
    V, n = ckpt.config["vocab_size"], 37
    ids = _vocab(ckpt, n)
    write_test_head(ckpt, vocab=ids)
    ckpt = load_checkpoint(gguf)
    L = ckpt.config["num_hidden_layers"]
    p = f"blk.{L}.nextn."
    assert ckpt.mtp[p + "draft_vocab"].fmt == "I32" and np.array_equal(ckpt.mtp[p + "draft_vocab"].raw, ids)
    trunk_head = ckpt.tensors.get("output") or ckpt.tensors["tok_embd"]
    head_rows = ckpt.mtp[p + "shared_head_head"]
    assert head_rows.fmt == trunk_head.fmt  # the trunk's rows as stored, not a float copy
    np.testing.assert_array_equal(head_rows.dequantize(), trunk_head.dequantize()[ids])
    runner = numpy_runner(ckpt, 256)
    head = runner.mtp
    assert head.head.shape == (n, ckpt.config["hidden_size"])
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((5, ckpt.config["hidden_size"])).astype(np.float32)
    logits, g = runner.mtp_forward([3, 9, 11, 40, 2], hidden, 0, True)
    assert logits.shape == (V,) and np.isneginf(logits[np.setdiff1d(np.arange(V), ids)]).all()
    # the draft is the argmax over the gathered rows, mapped back to its token id
    ops = runner.backend.ops(runner.mtp_cache, 0, 5, runner.args.rms_norm_eps, all_rows=False)
    normed = ops.rmsnorm(runner.mtp.forward(ops, [3, 9, 11, 40, 2], hidden, True)[1], head.norm)
    sub = normed[-1] @ trunk_head.dequantize()[ids].T
    np.testing.assert_array_equal(logits[ids], sub.astype(np.float32))
    draft = runner.mtp_draft([3, 9, 11, 40, 2], hidden, 0, 1, None, 0, [3, 9, 11, 40, 2])
    assert draft == [int(ids[np.argmax(logits[ids])])]


def test_speculation_with_a_reduced_vocabulary_head_equals_plain_decoding(tmp_path):
    gguf = make_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(gguf)
    tok = ckpt.tokenizer
    prompt = tok.encode("hello there, how are you")
    # the prompt's tokens and a few others: some drafts are accepted, some are out of the vocabulary
    ids = np.unique(np.concatenate([prompt, _vocab(ckpt, 24)])).astype(np.int32)
    write_test_head(ckpt, vocab=ids)
    runner = numpy_runner(load_checkpoint(gguf), 256)
    assert runner.mtp.vocab_map is not None
    stats = _identical(runner, tok, (1, 3, 8), [prompt], n_gen=20)
    assert all(s["spec_rounds"] > 0 for _, _, s in stats)


@pytest.mark.parametrize("bad", ["descending", "out of range", "float"])
def test_a_bad_draft_vocabulary_is_refused(tmp_path, bad):
    from bw24chat.loaders.hf_loader import write_safetensors

    gguf = make_gguf(tmp_path / "m.gguf")
    ckpt = load_checkpoint(gguf)
    V = ckpt.config["vocab_size"]
    tensors = write_test_head(ckpt, vocab=_vocab(ckpt, 8))
    info, _ = read_head(head_path(gguf))
    name = f"blk.{ckpt.config['num_hidden_layers']}.nextn.draft_vocab"
    tensors[name] = {"descending": np.array([9, 4, 1], np.int32), "out of range": np.array([1, V], np.int32),
                     "float": np.array([1.0, 2.0], np.float32)}[bad]
    write_head(head_path(gguf), tensors, info)
    with pytest.raises(ModelFileError, match="draft vocabulary"):
        load_checkpoint(gguf, draft_head=head_path(gguf))


def test_a_reduced_vocabulary_head_for_another_trunk_is_refused(tmp_path):
    mine = make_gguf(tmp_path / "a" / "mine.gguf", seed=0)
    other = make_gguf(tmp_path / "b" / "other.gguf", seed=1)
    write_test_head(load_checkpoint(mine), vocab=_vocab(load_checkpoint(mine), 16))
    with pytest.raises(ModelFileError, match="trained for another model"):
        load_checkpoint(other, draft_head=head_path(mine))


def test_the_draft_vocabulary_is_the_most_frequent_tokens_with_the_stop_tokens():
    from bw24chat.train_draft import choose_draft_vocab

    texts = [[5, 5, 5, 7, 7, 2], [9, 5, 7, 3, 3, 3, 3]]
    # counts: 3 -> 4, 5 -> 4, 7 -> 3, 2 -> 1, 9 -> 1; ties by the lower id; stop token 11 always in
    assert choose_draft_vocab(texts, 3, 12, keep=[11]).tolist() == [3, 5, 11]
    assert choose_draft_vocab(texts, 4, 12, keep=[11]).tolist() == [3, 5, 7, 11]
    assert choose_draft_vocab(texts, 50, 12).tolist() == [2, 3, 5, 7, 9]  # only the tokens the texts use
    assert choose_draft_vocab(texts, 0, 12).tolist() == list(range(12))
