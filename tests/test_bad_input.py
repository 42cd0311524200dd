"""The bad-input table: what the command line answers to broken models, bad flags and bad
prompts (one line on stderr, no traceback, the exit status SECURITY.md lists)."""
from __future__ import annotations

import json
import struct

import pytest

from bw24chat.cli import main
from tests.model_factory import make_gguf, make_hf_dir


def _truncated(tmp_path):
    p = make_gguf(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(p.read_bytes()[:40000])
    return str(cut)


def _wrong_magic(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"<html>404 Not Found</html>")
    return str(p)


def _header_1e15(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    f = d / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10**15) + f.read_bytes()[8:])
    return str(d)


def _broken_json(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8 + 67] = ord(";")
    f.write_bytes(bytes(raw))
    return str(d)


def _pickle(tmp_path):
    p = tmp_path / "pytorch_model.bin"
    p.write_bytes(b"\x80\x02}q\x00.")
    return str(p)


def _config_lies(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 40}))
    return str(d)


def _tiny(tmp_path):
    return str(make_gguf(tmp_path / "tiny.gguf"))


# case -> (model maker, extra arguments, prompt on stdin, exit status, message fragments)
CASES = {
    "truncated GGUF": (_truncated, [], "hi", 2, ["cut.gguf: tensor", "the file ends at byte 40000", "truncated"]),
    "not a GGUF (an HTML error page)": (_wrong_magic, [], "hi", 2, ["not a GGUF file", "<htm"]),
    "safetensors header length 10^15": (_header_1e15, [], "hi", 2, ["model.safetensors: header length", "1000000000000000"]),
    "broken safetensors JSON": (_broken_json, [], "hi", 2, ["model.safetensors: header: not valid JSON", "char 67"]),
    "a pickle checkpoint": (_pickle, [], "hi", 2, ["pytorch_model.bin", "never loads pickles", ".safetensors"]),
    "config.json says 40 layers": (_config_lies, [], "hi", 2, ["tensor model.layers.2.", "40-layer"]),
    "a missing file": (lambda t: str(t / "nope.gguf"), [], "hi", 2, ["nope.gguf: no such model file"]),
    "an unknown repo id": (lambda t: "nobody/no-such-model", [], "hi", 2, ["not in the local Hugging Face cache"]),
    "an empty prompt": (_tiny, [], "  \n", 2, ["empty prompt"]),
    "a negative temperature": (_tiny, ["--temperature", "-1"], "hi", 2, ["--temperature -1.0: expected"]),
    "top-p of 0": (_tiny, ["--top-p", "0"], "hi", 2, ["--top-p 0.0: expected"]),
    "max-tokens 0": (_tiny, ["--max-tokens", "0"], "hi", 2, ["--max-tokens 0: expected 1 or more"]),
    "a prompt longer than the context": (_tiny, ["--raw"], "word " * 400, 1, ["context full", "the context holds 256"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, tmp_path, capsys, monkeypatch):
    make, extra, prompt, status, fragments = CASES[case]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(prompt))
    code = main(["--headless", "--device", "cpu", "-m", make(tmp_path), *extra])
    err = capsys.readouterr().err
    assert code == status, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, err
