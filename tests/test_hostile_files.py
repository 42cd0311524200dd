"""Hostile and broken model files end in one ModelFileError naming the file, the field or tensor
and the problem: hand-made cases for each kind of lie, then bounded byte-mutation fuzzing
(Hypothesis-driven and seeded-random) of a tiny GGUF and a tiny safetensors folder, and of the
real SmolLM2 file's header.  ``tools/fuzz_models.py`` runs the long version."""
from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bw24chat.loaders import ModelFileError, load_checkpoint
from bw24chat.loaders.gguf_reader import GGUFFile
from tests.hostile_files import INTERESTING_U64, Tally, fuzz_gguf, fuzz_hf_dir, mutate, try_load
from tests.model_factory import make_gguf, make_hf_dir, write_safetensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return make_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return make_hf_dir(tmp_path_factory.mktemp("hf") / "tiny", "llama", "BF16")[0]


def refused(path: Path, *fragments: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        load_checkpoint(path)
    err = info.value
    assert str(path) in str(err), str(err)
    for f in fragments:
        assert f in str(err), str(err)
    return err


# ----------------------------------------------------------------------------- GGUF by hand
def gstr(s: bytes | str) -> bytes:
    s = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(s)) + s


def kv_str(key: str, value: bytes | str) -> bytes:
    return gstr(key) + struct.pack("<I", 8) + gstr(value)


def gguf_bytes(kvs: list[bytes], infos: list[bytes] = (), version: int = 3, n_tensors: int | None = None,
               n_kv: int | None = None, data: bytes = b"") -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % 32) + data


def tensor_info(name: str, ne: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ggml_type, offset)


ARCH = kv_str("general.architecture", "llama")

GGUF_CASES = {
    "empty file": (b"", ["the file is empty"]),
    "wrong magic": (b"GGUX" + b"\0" * 60, ["not a GGUF file"]),
    "pickle in disguise": (b"\x80\x04\x95" + b"\0" * 60, ["pickle", "safetensors"]),
    "version 1": (gguf_bytes([ARCH], version=1), ["version: GGUF version 1"]),
    "big-endian": (gguf_bytes([ARCH], version=3 << 24), ["big-endian"]),
    "only the magic": (b"GGUF", ["version: the file ends at byte 4"]),
    "absurd tensor count": (gguf_bytes([ARCH], n_tensors=1 << 60), ["tensor_count"]),
    "absurd kv count": (gguf_bytes([ARCH], n_kv=(1 << 64) - 1), ["metadata_kv_count"]),
    "huge key length": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 10**15) + b"\0" * 64, ["metadata key #0", "declared"]),
    "huge string value": (gguf_bytes([gstr("general.name") + struct.pack("<IQ", 8, 1 << 62)]), ["general.name", "declared"]),
    "huge array": (gguf_bytes([gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 1 << 61)]),
                   ["tokenizer.ggml.scores", "declared"]),
    "huge string array": (gguf_bytes([gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 40)]),
                          ["tokenizer.ggml.tokens", "declared"]),
    "arrays nested deep": (gguf_bytes([gstr("x") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 4, 0)]),
                           ["x[0][0]", "nested"]),
    "bad UTF-8 in a value": (gguf_bytes([ARCH, kv_str("general.name", b"ok\xff\xfe")]), ["general.name", "not valid UTF-8"]),
    "bad UTF-8 in a key": (gguf_bytes([kv_str(b"gen\xc3(", "x")]), ["metadata key #0", "not valid UTF-8"]),
    "unknown value type": (gguf_bytes([gstr("general.name") + struct.pack("<I", 77)]), ["general.name", "unknown metadata value type 77"]),
    "duplicate key": (gguf_bytes([ARCH, ARCH]), ["general.architecture", "twice"]),
    "alignment not a power of two": (gguf_bytes([gstr("general.alignment") + struct.pack("<II", 4, 24)]),
                                     ["general.alignment", "power of two"]),
    "five dimensions": (gguf_bytes([ARCH], [tensor_info("a.weight", (32, 1, 1, 1, 1))]), ["tensor a.weight", "5 dimensions"]),
    "long tensor name": (gguf_bytes([ARCH], [tensor_info("n" * 65, (32,))]), ["65 bytes", "64"]),
    "unknown tensor type": (gguf_bytes([ARCH], [tensor_info("a.weight", (32,), ggml_type=200)], data=b"\0" * 128),
                            ["tensor a.weight", "unknown ggml tensor type 200"]),
    "row not a whole block": (gguf_bytes([ARCH], [tensor_info("a.weight", (33,), ggml_type=2)], data=b"\0" * 128),
                              ["tensor a.weight", "Q4_0 rows of 33 values"]),
    "offset past the end": (gguf_bytes([ARCH], [tensor_info("a.weight", (8,), offset=1 << 40)], data=b"\0" * 32),
                            ["tensor a.weight", "needs bytes", "truncated"]),
    "size past the end": (gguf_bytes([ARCH], [tensor_info("a.weight", (1 << 40, 1 << 20))], data=b"\0" * 32),
                          ["tensor a.weight", "needs bytes"]),
    "a dimension past int64": (gguf_bytes([ARCH], [tensor_info("a.weight", (32, 1 << 63, 0))], data=b"\0" * 32),
                               ["tensor a.weight", "overflow a 64-bit element count"]),
    "unaligned offset": (gguf_bytes([ARCH], [tensor_info("a.weight", (8,), offset=4)], data=b"\0" * 64),
                         ["tensor a.weight", "not a multiple of the alignment"]),
    "overlapping tensors": (gguf_bytes([ARCH], [tensor_info("a.weight", (16,)), tensor_info("b.weight", (8,), offset=32)],
                                       data=b"\0" * 96), ["tensor b.weight", "overlaps tensor a.weight"]),
    "duplicate tensor": (gguf_bytes([ARCH], [tensor_info("a.weight", (8,)), tensor_info("a.weight", (8,), offset=32)],
                                    data=b"\0" * 64), ["tensor a.weight", "twice"]),
    "no architecture": (gguf_bytes([kv_str("general.name", "x")]), ["general.architecture", "missing"]),
    "architecture of the wrong type": (gguf_bytes([gstr("general.architecture") + struct.pack("<II", 4, 7)]),
                                       ["general.architecture", "expected str, found int"]),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_handmade_gguf(tmp_path, case):
    data, fragments = GGUF_CASES[case]
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    refused(path, *fragments)


LIES = {
    "one layer more than the file holds": ({"llama.block_count": 3}, ["tensor blk.2.attn_norm.weight", "missing"]),
    "one layer fewer": ({"llama.block_count": 1}, ["tensor blk.1.", "unexpected for a 1-layer model"]),
    "a wider model": ({"llama.embedding_length": 128}, ["tensor token_embd.weight", "shape [261, 64]", "[261, 128]"]),
    "a context of 2^31": ({"llama.context_length": 2**31}, ["llama.context_length", "2147483648"]),
    "no heads": ({"llama.attention.head_count": 0}, ["llama.attention.head_count", "not a positive integer"]),
    "heads that do not divide": ({"llama.attention.head_count_kv": 3}, ["llama.attention.head_count_kv"]),
    "another architecture": ({"general.architecture": "gpt2"}, ["general.architecture", "'gpt2' is not supported"]),
    "EOS outside the vocabulary": ({"tokenizer.ggml.eos_token_id": 9999}, ["tokenizer.ggml.eos_token_id", "9999"]),
    "no vocabulary": ({"tokenizer.ggml.tokens": None}, ["tokenizer.ggml.tokens", "no vocabulary"]),
    "a NaN rope base": ({"llama.rope.freq_base": float("nan")}, ["llama.rope.freq_base", "nan"]),
    "an unknown pre-tokenizer": ({"tokenizer.ggml.pre": "klingon"}, ["tokenizer.ggml", "klingon"]),
    "merges of tokens not in the vocabulary": ({"tokenizer.ggml.merges": ["x y"]}, ["tokenizer.ggml", "vocabulary cannot be built"]),
    "token types of the wrong length": ({"tokenizer.ggml.token_type": [1, 1]}, ["tokenizer.ggml.token_type", "2 entries for 261"]),
    "a yarn scaling without numbers": ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": "big"}, ["rope"]),
}


@pytest.mark.parametrize("case", sorted(LIES))
def test_gguf_header_that_lies(tmp_path, case):
    metadata, fragments = LIES[case]
    refused(make_gguf(tmp_path / "m.gguf", metadata=metadata), *fragments)


def test_truncated_gguf_names_the_tensor_and_bytes(tiny_gguf, tmp_path):
    """The issue's example: "file ends at byte N; tensor X needs bytes A-B: the download is incomplete"."""
    gf = GGUFFile(tiny_gguf)
    last = max(gf.tensors, key=lambda t: t.offset)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: last.offset + 10])
    refused(cut, f"tensor {last.name}", f"the file ends at byte {last.offset + 10}",
            f"needs bytes {last.offset}-{last.offset + last.nbytes}", "incomplete download")
    cut.write_bytes(tiny_gguf.read_bytes()[:1000])  # inside the vocabulary
    refused(cut, "tokenizer.ggml.tokens", "the file ends at byte 1000")


def test_every_cut_of_the_tiny_gguf_is_refused(tiny_gguf, tmp_path):
    data = tiny_gguf.read_bytes()
    tally = Tally()
    path = tmp_path / "cut.gguf"
    for n in list(range(0, 400, 7)) + list(range(400, len(data), max(len(data) // 150, 1))):
        path.write_bytes(data[:n])
        try_load(path, tally, f"cut at {n}", use_model=False)
    assert tally.failures == [] and tally.ok == 0 and tally.trials == sum(tally.errors.values())


# ----------------------------------------------------------------------------- safetensors / folders
def test_safetensors_header_length_of_10_to_the_15(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "BF16")
    f = d / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10**15) + f.read_bytes()[8:])
    refused(d, str(f), "header length", f"declares a {10**15}-byte header")


def _with_header(folder: Path, change) -> Path:
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    change(header)
    h = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])
    return f


EMBED = "model.embed_tokens.weight"
ST_CASES = {
    "offsets past the end": (lambda h: h[EMBED].update(data_offsets=[10**12, 10**12 + h[EMBED]["data_offsets"][1] - h[EMBED]["data_offsets"][0]]),
                             ["tensor model.embed_tokens.weight", "truncated"]),
    "offsets that disagree with the shape": (lambda h: h[EMBED].update(shape=[3, 3]), ["tensor model.embed_tokens.weight", "do not hold BF16 [3, 3]"]),
    "unknown dtype": (lambda h: h[EMBED].update(dtype="Q9"), ["tensor model.embed_tokens.weight", "unknown dtype 'Q9'"]),
    "negative shape": (lambda h: h[EMBED].update(shape=[-1, 64]), ["tensor model.embed_tokens.weight", "not a list of sizes"]),
    "overlap": (lambda h: h["model.norm.weight"].update(data_offsets=[0, h["model.norm.weight"]["data_offsets"][1] - h["model.norm.weight"]["data_offsets"][0]]),
                ["overlaps tensor"]),
    "metadata not strings": (lambda h: h.update(__metadata__={"a": 1}), ["__metadata__"]),
    "entry not an object": (lambda h: h.update({EMBED: 5}), ["tensor model.embed_tokens.weight", "not an object"]),
    "an unknown tensor": (lambda h: h.update({"model.vision_tower.weight": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}),
                          ["tensor model.vision_tower.weight", "no use for it"]),
}


@pytest.mark.parametrize("case", sorted(ST_CASES))
def test_handmade_safetensors(tmp_path, case):
    change, fragments = ST_CASES[case]
    d, _ = make_hf_dir(tmp_path / "m", "llama", "BF16")
    f = _with_header(d, change)
    refused(d, *fragments) if case == "an unknown tensor" else refused(d, str(f), *fragments)


def test_broken_json_files_are_named(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8 + 60] = ord("@")  # inside the JSON header
    f.write_bytes(bytes(raw))
    refused(d, str(f), "header: not valid JSON (", "char")
    for name in ("config.json", "tokenizer_config.json", "generation_config.json", "tokenizer.json"):
        d, _ = make_hf_dir(tmp_path / name, "llama", "F32")
        (d / name).write_text('{"a": 1,, }')
        refused(d, str(d / name), "not valid JSON")


CONFIG_LIES = {
    "a layer more": ({"num_hidden_layers": 3}, ["tensor model.layers.2.input_layernorm.weight", "missing"]),
    "a narrower model": ({"hidden_size": 32}, ["tensor lm_head.weight", "shape [259, 64]", "imply [259, 32]"]),
    "another architecture": ({"architectures": ["BertModel"]}, ["architectures", "BertModel"]),
    "heads as a string": ({"num_attention_heads": "four"}, ["num_attention_heads", "'four'"]),
    "a negative width": ({"intermediate_size": -96}, ["intermediate_size", "-96"]),
    "an absurd context": ({"max_position_embeddings": 10**12}, ["max_position_embeddings"]),
    "a bad rope scaling": ({"rope_scaling": {"rope_type": "yarn", "factor": "x"}}, ["rope_scaling", "RoPE"]),
    "an unknown rope scaling": ({"rope_scaling": {"rope_type": "warp"}}, ["rope_scaling", "warp"]),
    "a vocabulary smaller than the weights": ({"vocab_size": 7}, ["tensor lm_head.weight", "imply [7, 64]"]),
    "not an object": (None, ["config.json", "expected a JSON object, found list"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_LIES))
def test_config_json_that_lies(tmp_path, case):
    patch, fragments = CONFIG_LIES[case]
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps([cfg] if patch is None else {**cfg, **patch}))
    refused(d, *fragments)


def test_shard_index_cannot_point_outside_the_folder(tmp_path):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    secret = tmp_path / "secret.safetensors"
    (d / "model.safetensors").rename(secret)
    for target in ("../secret.safetensors", str(secret), "sub/../../secret.safetensors"):
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {EMBED: target}}))
        refused(d, "model.safetensors.index.json", "weight_map", "not a file of the model folder")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "consolidated.pth"])
def test_pickle_checkpoints_are_refused(tmp_path, name):
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    (d / "model.safetensors").unlink()
    (d / name).write_bytes(b"\x80\x04\x95")  # never opened: refused by name
    refused(d, name, "pickle", "safetensors")
    refused(d / name, "pickle", "never loads")


# ----------------------------------------------------------------------------- fuzzing
def _no_failures(tally: Tally) -> None:
    assert tally.failures == [], "\n".join(tally.failures[:20])
    assert tally.ok + sum(tally.errors.values()) == tally.trials


def test_fuzz_tiny_gguf(tiny_gguf, tmp_path):
    tally = fuzz_gguf(tiny_gguf, tmp_path, trials=400, seed=20240601)
    _no_failures(tally)
    assert len(tally.errors) >= 15  # the mutations reach many different checks


def test_fuzz_tiny_hf_folder(tiny_hf, tmp_path):
    tally = fuzz_hf_dir(tiny_hf, tmp_path, trials=150, seed=20240601)
    _no_failures(tally)
    assert len(tally.errors) >= 10


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.integers(0, 5000), st.sampled_from(INTERESTING_U64), st.sampled_from([1, 4, 8])),
                    min_size=1, max_size=4),
       cut=st.none() | st.integers(0, 70000))
def test_hypothesis_gguf_fields(tiny_gguf, tmp_path, ops, cut):
    """Hypothesis picks header positions and the values written there (it shrinks a failure to
    the fewest, smallest writes)."""
    data = bytearray(tiny_gguf.read_bytes())
    for pos, value, width in ops:
        data[pos : pos + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    path = tmp_path / "h.gguf"
    path.write_bytes(bytes(data[:cut]))
    tally = Tally()
    try_load(path, tally, f"{ops} cut {cut}")
    _no_failures(tally)


@pytest.mark.slow
def test_fuzz_real_model_header(smollm2_path, tmp_path):
    """The real SmolLM2 file: mutations in its 1.8 MB header (49k tokens, 48k merges)."""
    gf = GGUFFile(smollm2_path)
    data = smollm2_path.read_bytes()[: gf.data_offset + (1 << 20)]  # the header and the first MB of weights
    rng = random.Random(7)
    tally = Tally()
    path = tmp_path / "real.gguf"
    for i in range(40):
        path.write_bytes(mutate(data, rng, gf.data_offset))
        try_load(path, tally, f"real trial {i}", use_model=False, hang_s=60)
    _no_failures(tally)


def test_code_in_a_model_folder_never_runs(tmp_path):
    """A repo's Python (auto_map, trust_remote_code) is never imported: the model loads as the
    supported architecture it names, and the marker file the code would write never appears."""
    d, _ = make_hf_dir(tmp_path / "m", "llama", "F32")
    marker = tmp_path / "pwned"
    for name in ("modeling_evil.py", "configuration_evil.py", "tokenization_evil.py", "__init__.py"):
        (d / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM", "AutoConfig": "configuration_evil.EvilConfig"}
    (d / "config.json").write_text(json.dumps(cfg))
    tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "auto_map": {"AutoTokenizer": ["tokenization_evil.T", None]}}))
    assert load_checkpoint(d).arch == "llama"
    assert not marker.exists()
    cfg["architectures"] = ["EvilForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    refused(d, "architectures", "EvilForCausalLM")
    assert not marker.exists()


@pytest.mark.parametrize("case", ["scale of the wrong shape", "no global scale", "FP8 block scales of the wrong shape"])
def test_quantized_safetensors_with_bad_scales(tmp_path, case):
    import numpy as np

    from bw24chat.loaders.hf_loader import SafetensorsFile

    d, _ = make_hf_dir(tmp_path / "m", "llama", "BF16", hidden_size=128, intermediate_size=128, head_dim=32)
    f = SafetensorsFile(d / "model.safetensors")
    tensors = {n: (f.header[n]["dtype"], f.get(n)[0]) for n in f.header}
    del f
    q, k = "model.layers.0.self_attn.q_proj.", "model.layers.0.self_attn.k_proj."
    tensors[q + "weight"] = ("U8", np.zeros((128, 64), np.uint8))
    tensors[q + "weight_scale"] = ("F8_E4M3", np.zeros((128, 8 if case != "scale of the wrong shape" else 7), np.uint8))
    if case != "no global scale":
        tensors[q + "weight_scale_2"] = ("F32", np.array([0.02], np.float32))
    tensors[k + "weight"] = ("F8_E4M3", np.zeros((64, 128), np.uint8))
    tensors[k + "weight_scale_inv"] = ("F32", np.ones((1, 1) if case != "FP8 block scales of the wrong shape" else (2, 1), np.float32))
    write_safetensors(d / "model.safetensors", tensors)
    expected = {"scale of the wrong shape": ["tensor model.layers.0.self_attn.q_proj.weight_scale", "[128, 7]", "[128, 8]"],
                "no global scale": ["tensor model.layers.0.self_attn.q_proj.weight_scale_2", "missing"],
                "FP8 block scales of the wrong shape": ["k_proj.weight_scale_inv", "[2, 1]", "[1, 1]"]}[case]
    refused(d, *expected)
