"""config.toml: defaults, round trip, tolerance of bad files, atomic writes, CLI overrides."""
from __future__ import annotations

import dataclasses
import os
import tomllib

from bw24chat.api import SamplingParams
from bw24chat.config import (
    Config,
    config_path,
    dumps_toml,
    load_config,
    save_config,
    update_saved_config,
    with_cli_overrides,
)
from bw24chat.options import EngineOptions


def test_defaults_without_a_file(tmp_path):
    assert load_config(tmp_path / "none.toml") == Config()


def test_round_trip(tmp_path):
    config = Config(theme="nord", system_prompt='Say "hi"\n\tthen \\stop\x01', recent_models=["/m/a.gguf", "b"])
    config.options.kv_cache = "fp8"
    config.options.activations = "bf16"
    config.options.n_ctx = 8192
    config.options.vram_budget_gb = 7.5
    config.options.sampling = SamplingParams(temperature=0.0, top_p=0.9, top_k=40, min_p=0.05, max_tokens=99, seed=7)
    config.options.sampling_set = frozenset({"temperature", "top_p", "top_k", "min_p"})
    path = save_config(config, tmp_path / "c" / "config.toml")
    assert load_config(path) == config


def test_sampling_values_not_chosen_follow_the_model(tmp_path):
    config = Config()
    config.options.sampling.temperature = 0.1
    config.options.sampling.top_k = 7
    config.options.sampling_set = frozenset({"top_k"})
    loaded = load_config(save_config(config, tmp_path / "config.toml"))
    assert loaded.options.sampling_set == {"top_k"}
    model = {"temperature": 0.2, "top_k": 50, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.0}
    sp = loaded.sampling(model)
    assert (sp.temperature, sp.top_k, sp.top_p) == (0.2, 7, 0.9)


def test_the_default_path_is_in_the_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BW24CHAT_CONFIG_DIR", str(tmp_path / "cfg"))
    save_config(Config(theme="gruvbox"))
    assert config_path() == tmp_path / "cfg" / "config.toml"
    assert load_config().theme == "gruvbox"


def test_a_seed_of_none_is_left_out(tmp_path):
    path = save_config(Config(), tmp_path / "config.toml")
    assert "seed" not in tomllib.loads(path.read_text())["sampling"]


def test_bad_values_and_files_fall_back_to_defaults(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[sampling]\ntemperature = "hot"\ntop_k = 5\nseed = true\n[engine]\nn_ctx = 2.5\nkv_cache = "f64"\nactivations = "f16"\n'
        '[ui]\ntheme = 3\n[models]\nrecent = ["a", 1]\n'
    )
    config = load_config(path)
    assert config.options.sampling.temperature == 0.7 and config.options.sampling.top_k == 5
    assert config.options.sampling.seed is None and config.options.n_ctx == 0
    assert config.options.kv_cache == "bf16"  # not one of the --kv-cache choices
    assert config.options.activations == "f32"  # nor of --activations
    assert config.theme == "textual-dark" and config.recent_models == ["a"]
    path.write_text("this is [not toml")
    broken = load_config(path)
    assert broken.problem and dataclasses.replace(broken, problem=None) == Config()  # reported, defaults used


def test_ints_are_accepted_for_floats(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[sampling]\ntemperature = 1\n")
    assert load_config(path).options.sampling.temperature == 1.0


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "config.toml"
    save_config(Config(theme="a"), path)
    save_config(Config(theme="b"), path)
    assert os.listdir(tmp_path) == ["config.toml"]
    assert load_config(path).theme == "b"


def test_dumps_toml_is_valid_toml():
    data = {"t": {"s": "x\"y\\z\nw", "i": 3, "f": 0.1, "b": True, "l": ["a", "b"], "e": []}}
    assert tomllib.loads(dumps_toml(data)) == data


def test_command_line_values_override_the_file_but_defaults_do_not():
    config = Config()
    config.options.sampling.temperature = 0.2
    config.options.kv_cache = "q8_0"
    cli = EngineOptions(model="x", n_ctx=8192, sampling=SamplingParams(top_k=20, stop=["</s>"]), sampling_set=frozenset({"top_k"}))
    merged = with_cli_overrides(config, cli)
    assert merged.options.sampling.temperature == 0.2  # not given on the command line
    assert merged.options.kv_cache == "q8_0"
    assert merged.options.n_ctx == 8192 and merged.options.sampling.top_k == 20
    assert merged.options.sampling.stop == ["</s>"]
    assert config.options.n_ctx == 0  # the original is untouched


def test_update_saved_config_changes_only_the_file(tmp_path):
    path = tmp_path / "config.toml"
    save_config(Config(theme="a"), path)
    update_saved_config(lambda c: c.remember_model("m1"), path)
    update_saved_config(lambda c: c.remember_model("m2"), path)
    update_saved_config(lambda c: c.remember_model("m1"), path)
    config = load_config(path)
    assert config.recent_models == ["m1", "m2"] and config.theme == "a"


def test_engine_options_for_a_model():
    config = Config()
    config.options.kv_cache = "fp8"
    options = config.engine_options("model.gguf")
    assert options.model == "model.gguf" and options.kv_cache == "fp8"
    assert config.options.model is None
    assert config.sampling() == config.options.sampling and config.sampling() is not config.options.sampling


def test_speculative_choices_are_kept_and_checked(tmp_path):
    path = tmp_path / "config.toml"
    config = Config()
    config.options.spec, config.options.spec_k = "ngram", 5
    loaded = load_config(save_config(config, path))
    assert (loaded.options.spec, loaded.options.spec_k) == ("ngram", 5)
    path.write_text('[engine]\nspec = "medusa"\nspec_k = 9\n')  # not a --spec choice; above MAX_K
    loaded = load_config(path)
    assert (loaded.options.spec, loaded.options.spec_k) == ("off", 0)
    cli = EngineOptions(model="x", spec_k=2)  # --spec-k 2 given, --spec left at its default
    merged = with_cli_overrides(config, cli)
    assert (merged.options.spec, merged.options.spec_k) == ("ngram", 2)
