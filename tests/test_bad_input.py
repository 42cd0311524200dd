"""The bad-input table: what the command line answers to broken models, bad flags and bad
prompts (one line on stderr, no traceback, the exit status SECURITY.md lists)."""
from __future__ import annotations

import json
import struct

import pytest

from bw24chat.cli import main
from tests.model_factory import make_gguf, make_hf_dir


def _tiny(tmp_path):
    return str(make_gguf(tmp_path / "tiny.gguf"))


def _file(name: str, data: bytes):
    """A model maker writing ``data`` as ``name``."""

    def make(tmp_path):
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    return make


def _hf_folder(name: str, change):
    """A model maker: a tiny safetensors folder whose file ``name`` goes through ``change(bytes)``."""

    def make(tmp_path):
        d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
        (d / name).write_bytes(change((d / name).read_bytes()))
        return str(d)

    return make


def _truncated(tmp_path):
    return _file("cut.gguf", (make_gguf(tmp_path / "tiny.gguf").read_bytes()[:40000]))(tmp_path)


# case -> (model maker, extra arguments, prompt on stdin, exit status, message fragments)
CASES = {
    "truncated GGUF": (_truncated, [], "hi", 2, ["cut.gguf: tensor", "the file ends at byte 40000", "truncated"]),
    "not a GGUF (an HTML error page)": (_file("model.gguf", b"<html>404 Not Found</html>"), [], "hi", 2, ["not a GGUF file", "<htm"]),
    "safetensors header length 10^15": (_hf_folder("model.safetensors", lambda raw: struct.pack("<Q", 10**15) + raw[8:]), [], "hi", 2, ["model.safetensors: header length", "1000000000000000"]),
    "broken safetensors JSON": (_hf_folder("model.safetensors", lambda raw: raw[:75] + b";" + raw[76:]), [], "hi", 2, ["model.safetensors: header: not valid JSON", "char 67"]),
    "a pickle checkpoint": (_file("pytorch_model.bin", b"\x80\x02}q\x00."), [], "hi", 2, ["pytorch_model.bin", "never loads pickles", ".safetensors"]),
    "config.json says 40 layers": (_hf_folder("config.json", lambda raw: json.dumps({**json.loads(raw), "num_hidden_layers": 40}).encode()), [], "hi", 2, ["tensor model.layers.2.", "40-layer"]),
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


@pytest.mark.parametrize("max_batch", [1, 0], ids=["one-at-a-time", "batched"])
def test_out_of_memory_mid_reply_fails_the_request_and_the_engine_keeps_serving(tmp_path, max_batch):
    """An allocation failure inside the runner (the GPU's OutOfMemoryError, or a host MemoryError)
    ends that request with an error event naming it; the cache's unknown contents are forgotten,
    and the next request runs to completion with the tokens a fresh engine gives.  The same for
    the one-request-at-a-time engine (a failing step) and the batching one (a failing batch_step:
    the step's requests fail, their blocks go back)."""
    from bw24chat.api import DoneEvent, ErrorEvent, GenerationRequest, SamplingParams
    from bw24chat.engine import open_engine, out_of_memory
    from bw24chat.options import EngineOptions

    from .model_factory import make_gguf

    class OutOfMemoryError(Exception):  # what CuPy raises (cupy.cuda.memory.OutOfMemoryError)
        pass

    assert out_of_memory(OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes"))
    assert out_of_memory(MemoryError()) and not out_of_memory(RuntimeError("boom"))
    engine = open_engine(EngineOptions(model=str(make_gguf(tmp_path / "m.gguf")), device="cpu", max_batch=max_batch))
    assert engine.batched == (max_batch != 1)
    req = lambda: GenerationRequest(prompt="hello there, how are you", sampling=SamplingParams(temperature=0, max_tokens=8))  # noqa: E731
    name = "batch_step" if engine.batched else "step"
    try:
        want = list(engine.submit(req()).events())[-1]
        real_step, calls = getattr(engine.runner, name), []

        def failing_step(*a, **k):  # the third step of the next reply fails
            calls.append(1)
            if len(calls) == 3:
                raise OutOfMemoryError("Out of memory allocating 536,870,912 bytes (allocated so far: 79 GiB)")
            return real_step(*a, **k)

        setattr(engine.runner, name, failing_step)
        evs = list(engine.submit(req()).events())
        assert isinstance(evs[-1], ErrorEvent) and "ran out of memory" in evs[-1].message
        if engine.batched:
            assert engine.stats()["kv_blocks_used"] == 0  # its blocks are back
        else:
            assert engine.generator.cached == []  # forgotten: the next request prefills from scratch
        setattr(engine.runner, name, real_step)
        again = list(engine.submit(req()).events())[-1]
        assert isinstance(again, DoneEvent) and again.text == want.text
    finally:
        engine.close()
