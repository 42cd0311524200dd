"""The local model catalog behind the model manager: GGUF and HF-folder metadata, the
folders it scans, and the VRAM estimate."""
from __future__ import annotations

import json

import numpy as np

from bw24chat import model_catalog
from bw24chat.model_catalog import GpuMemory, ModelShape, describe_model, estimate_vram, kv_per_token, list_local_models
from bw24chat.tui.screens.models import vram_text
from tests.tui.tui_helpers import write_gguf


def test_a_gguf_is_described_from_its_header(tmp_path):
    path = write_gguf(tmp_path / "tiny-Q4_1.gguf", name="Tiny", file_type=3, n_ctx=2048)
    m = describe_model(path)
    assert (m.name, m.arch, m.quant, m.fmt, m.n_ctx_train) == ("Tiny", "llama", "Q4_1", "gguf", 2048)
    assert m.size == path.stat().st_size
    # 4 layers x 2 KV heads x head dim 16 (64 / 4 heads), K and V, 2048 tokens, bf16
    assert m.vram_needed() == m.size + 2 * 4 * 2 * 16 * 2048 * 2 + model_catalog._WORKSPACE_BYTES


def test_a_split_gguf_counts_all_its_parts(tmp_path):
    first = write_gguf(tmp_path / "big-00001-of-00002.gguf")
    second = tmp_path / "big-00002-of-00002.gguf"
    second.write_bytes(b"\0" * 1000)
    m = describe_model(first)
    assert m.size == first.stat().st_size + 1000


def test_an_hf_folder_is_described_from_config_json(tmp_path):
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "torch_dtype": "bfloat16",
                "num_hidden_layers": 2,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "hidden_size": 256,
                "max_position_embeddings": 32768,
            }
        )
    )
    (folder / "model.safetensors").write_bytes(b"\0" * 5000)
    m = describe_model(folder)
    assert (m.arch, m.quant, m.fmt, m.size, m.n_ctx_train) == ("qwen3", "BF16", "safetensors", 5000, 32768)
    assert m.vram_needed() == estimate_vram(5000, kv_per_token(ModelShape(2, 2, 64)), 32768)


def test_the_estimate_counts_the_kv_pool_where_the_engine_batches(tmp_path):
    """An engine that batches requests keeps a paged KV pool beside the context's cache: 1 GiB of
    K/V (kv_pages.KV_POOL_BYTES) for a small model, one context and a block for a large one."""
    from bw24chat.kv_pages import KV_POOL_BYTES

    m = describe_model(write_gguf(tmp_path / "tiny-Q4_1.gguf", name="Tiny", file_type=3, n_ctx=2048))
    assert m.vram_needed(batching=True) - m.vram_needed() == KV_POOL_BYTES
    per_token = kv_per_token(ModelShape(64, 8, 128))  # 256 KiB a position: 1 GiB holds 4096, one context
    pool = estimate_vram(0, per_token, 40960, batching=True) - estimate_vram(0, per_token, 40960)
    assert pool == (4096 // 64 + 1) * 64 * per_token
    assert estimate_vram(5000, 0, None, batching=True) == estimate_vram(5000, 0, None)  # the shape unknown: no pool


def test_a_stale_description_is_read_again(tmp_path, monkeypatch):
    """A description cached by an older catalog (other fields) is described afresh, not misread."""
    monkeypatch.setattr(model_catalog, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(model_catalog, "_described", model_catalog._DescriptionCache())
    path = write_gguf(tmp_path / "tiny-Q4_1.gguf", name="Tiny", file_type=3, n_ctx=2048)
    key = model_catalog._described.key(path)
    (tmp_path / "model_catalog.json").write_text(json.dumps({key: {"name": "Old", "path": str(path), "source": "manual",
                                                                   "location": "x", "fmt": "gguf", "vram_needed": 1}}))
    m = describe_model(path)
    assert m.name == "Tiny" and m.kv_per_token == 2 * 4 * 2 * 16 * 2


def test_a_broken_file_is_listed_with_its_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    m = describe_model(bad)
    assert m.error and m.fmt == "gguf"


def test_listing_scans_the_models_folder_the_hf_cache_and_recent_paths(private_dirs, tmp_path):
    write_gguf(private_dirs["models"] / "a" / "one.gguf", name="One")
    write_gguf(private_dirs["models"] / "a" / "one.gguf.part")  # an unfinished download: not a model
    snapshot = private_dirs["hf"] / "models--org--two" / "snapshots" / ("b" * 40)
    write_gguf(snapshot / "two.gguf", name="Two")
    (private_dirs["hf"] / "models--org--two" / "refs").mkdir(parents=True)
    (private_dirs["hf"] / "models--org--two" / "refs" / "main").write_text("b" * 40)
    elsewhere = write_gguf(tmp_path / "x" / "three.gguf", name="Three")
    models = list_local_models(
        recent=[str(elsewhere), str(private_dirs["models"] / "a" / "one.gguf"), "/gone.gguf"], hf_cache=private_dirs["hf"]
    )
    assert [(m.name, m.source, m.location) for m in models] == [
        ("One", "models", "models/a/one.gguf"),
        ("Two", "hf-cache", "org/two/two.gguf"),
        ("Three", "recent", str(elsewhere)),
    ]


def test_no_gpu_library_means_no_gpu(monkeypatch):
    def missing():
        raise ImportError("no pynvml / cupy here")

    monkeypatch.setattr(model_catalog, "_nvml_memory", missing)
    monkeypatch.setattr(model_catalog, "_cupy_memory", missing)
    assert model_catalog.gpu_memory() is None


def test_vram_text_compares_with_the_free_memory():
    gpu = GpuMemory("G", free=2 * 2**30, total=8 * 2**30)
    assert vram_text(2**30, gpu) == "1.0 GiB ✓"
    assert vram_text(3 * 2**30, gpu) == "3.0 GiB ✗"
    assert vram_text(2**30, None) == "1.0 GiB"
    assert vram_text(None, gpu) == "?"


def test_descriptions_are_cached_on_disk_until_the_file_changes(private_dirs, monkeypatch):
    path = write_gguf(private_dirs["models"] / "m.gguf", name="Cached")
    assert list_local_models()[0].name == "Cached"
    assert (private_dirs["cache"] / "model_catalog.json").exists()

    monkeypatch.setattr(model_catalog, "_described", model_catalog._DescriptionCache())  # as a new process

    def must_not_read(model):
        raise AssertionError("read the GGUF again")

    monkeypatch.setattr(model_catalog, "_describe_gguf", must_not_read)
    assert list_local_models()[0].name == "Cached"
    write_gguf(path, name="Changed")  # a new file: read again (here: the error shows)
    assert list_local_models()[0].error


def test_a_draft_head_is_shown_shipped_or_trained(private_dirs):
    import gguf

    from bw24chat.loaders.draft_head import head_path

    plain = write_gguf(private_dirs["models"] / "plain.gguf", name="Plain")
    trained = write_gguf(private_dirs["models"] / "trained.gguf", name="Trained")
    head_path(trained).write_bytes(b"a head")
    shipped = private_dirs["models"] / "shipped.gguf"
    w = gguf.GGUFWriter(str(shipped), "glm4moe")
    w.add_name("Shipped")
    w.add_uint32("glm4moe.nextn_predict_layers", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    folder = private_dirs["models"] / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 2}))
    (folder / "model.safetensors").write_bytes(b"\0" * 100)
    head_path(folder).write_bytes(b"\0" * 7)  # inside the folder: not counted as weights
    heads = {m.name: m.draft_head for m in list_local_models()}
    assert heads == {"Plain": None, "Trained": "trained", "Shipped": "shipped", "folder": "trained"}
    assert next(m for m in list_local_models() if m.name == "folder").size == 100
    assert plain.exists()
