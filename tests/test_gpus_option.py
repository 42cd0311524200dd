"""--gpus: a count or a comma list of device ids; on the CPU or with GPUs missing, one line naming
what was asked and what exists, exit code 2; one GPU is the single-GPU engine; several GPUs go
through the partition plan's refusals."""
import argparse
import json

import pytest

import bw24chat.backends as backends
from bw24chat.backends import check_gpus
from bw24chat.cli import build_parser, main
from bw24chat.engine import open_engine
from bw24chat.options import EngineOptions, OptionError, gpu_ids, options_from_args
from bw24chat.parallel import PartitionError
from tests.model_factory import make_hf_dir


@pytest.mark.parametrize("text,ids", [("1", (0,)), ("2", (0, 1)), ("4", (0, 1, 2, 3)), ("0,1", (0, 1)),
                                      ("2,3", (2, 3)), ("1,", (1,)), (" 0, 1 ", (0, 1))])
def test_parse(text, ids):
    assert gpu_ids(text) == ids


@pytest.mark.parametrize("text", ["0", "-1", "a", "1,1", "-1,0", ",", "1.5", ""])
def test_parse_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="GPU count"):
        gpu_ids(text)


def test_options():
    assert options_from_args(build_parser().parse_args([])).gpus == () == EngineOptions().gpus
    assert options_from_args(build_parser().parse_args(["--gpus", "0,1"])).gpus == (0, 1)


def test_one_gpu_is_the_single_gpu_engine():
    for gpus in ((), (0,)):  # no check at all: the existing path, on any device
        check_gpus(gpus, "cpu")


def test_cpu_refused_exit_2(capsys):
    assert main(["--gpus", "2", "--device", "cpu", "--headless", "hi"]) == 2
    err = capsys.readouterr().err
    assert "--gpus asks for GPUs 0, 1, but --device cpu runs on the CPU" in err and err.count("\n") == 1


def test_check_gpus_refused_without_them(capsys):
    """bw24chat check --gpus: the split runner's gates need the GPUs; on the CPU or with --batch
    (batched decoding is not split) one line and exit code 2."""
    assert main(["check", "--gpus", "1", "--device", "cpu"]) == 2
    assert "--gpus 0: the model is split over GPUs, but no usable CUDA GPU: --device cpu" in capsys.readouterr().err
    assert main(["check", "--gpus", "0,1", "--batch"]) == 2
    assert "--gpus 0,1 --batch: batched decoding does not run over several GPUs" in capsys.readouterr().err


def test_missing_gpus_named(monkeypatch, capsys):
    monkeypatch.setattr(backends, "cuda_devices", lambda: (0, "no NVIDIA GPU found"))
    assert main(["--gpus", "0,1", "--headless", "hi"]) == 2
    assert "--gpus asks for GPUs 0, 1, but this host's usable NVIDIA GPUs: none: no NVIDIA GPU found" in capsys.readouterr().err
    monkeypatch.setattr(backends, "cuda_devices", lambda: (2, "ok"))
    with pytest.raises(OptionError, match=r"asks for GPUs 0, 1, 2, 3, but this host's usable NVIDIA GPUs: 2 \(0, 1\)"):
        check_gpus((0, 1, 2, 3), "auto")
    with pytest.raises(OptionError, match="CUDA_VISIBLE_DEVICES=1"):
        check_gpus((1,), "cuda")
    check_gpus((0, 1), "cuda")


def test_several_gpus_go_through_the_plan(monkeypatch, tmp_path):
    """With the GPUs present: a model whose heads do not divide is refused naming them; one that
    would copy MiniMax-M2's KV heads (its QK-norm over the whole k projection) is refused naming
    that, before its weights load; a split model, dense or MoE, never falls back to the CPU."""
    monkeypatch.setattr(backends, "cuda_devices", lambda: (4, "ok"))
    d, _ = make_hf_dir(tmp_path / "m", "qwen3", "F32")  # 4 query heads, 2 KV heads
    with pytest.raises(PartitionError, match="num_attention_heads = 4 does not divide over 3 GPUs"):
        open_engine(EngineOptions(model=str(d), gpus=(0, 1, 2)))
    mm, _ = make_hf_dir(tmp_path / "mm", "minimax_m2", "F32")
    kv = json.loads((mm / "config.json").read_text())["num_key_value_heads"]
    with pytest.raises(PartitionError, match="QK-norm over the whole k projection needs each KV head on one GPU"):
        open_engine(EngineOptions(model=str(mm), gpus=tuple(range(2 * kv))))
    monkeypatch.setattr("bw24chat.engine.pick_device", lambda requested: ("cpu", "no GPU"))
    moe, _ = make_hf_dir(tmp_path / "moe", "qwen3_moe", "F32")  # MoE experts split by expert ranges: planned
    for model in (d, moe, mm):
        with pytest.raises(OptionError, match="--gpus 0,1: the model is split over GPUs, but the engine runs on the CPU"):
            open_engine(EngineOptions(model=str(model), gpus=(0, 1)))
