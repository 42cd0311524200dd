"""Engine options shared by the TUI, the headless mode and the server (one set of flags)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .api import SamplingParams


@dataclass
class EngineOptions:
    model: str | None = None  # GGUF path, HF directory, or HF repo id in the local cache
    device: str = "auto"  # auto | cpu | cuda
    n_ctx: int = 0  # 0: the model's own maximum (capped by memory on the device)
    kv_cache: str = "bf16"  # bf16 | q8_0 | fp8 | f32   (CUDA backend)
    activations: str = "f32"  # f32 | bf16: matmul inputs exact, or rounded to bf16 (CUDA backend)
    quantize: str | None = None  # re-encode weights at load: nvfp4 | q8_0
    speculative: str = "off"  # off | mtp
    spec_k: int = 4
    vram_budget_gb: float = 0.0  # 0: all free VRAM
    max_queue: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("-m", "--model", help="GGUF file, Hugging Face directory, or repo id in the local HF cache")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    g.add_argument("--ctx", dest="n_ctx", type=int, default=0, help="context length (default: the model's)")
    g.add_argument("--kv-cache", choices=["bf16", "q8_0", "fp8", "f32"], default="bf16",
                   help="KV cache type on the GPU (f32: exact, 2x the bytes of bf16)")
    g.add_argument("--activations", choices=["f32", "bf16"], default="f32",
                   help="matmul inputs on the GPU: float32 (default: prefill and decode logits agree to ~1e-5) or "
                        "rounded to bf16 as bf16 engines do (prefill ~1.3-1.4x faster; the two paths then agree "
                        "to ~3e-3 and can pick different tokens at small margins)")
    g.add_argument("--quantize", choices=["nvfp4", "q8_0"], default=None, help="re-encode weights at load")
    g.add_argument("--speculative", choices=["off", "mtp"], default="off")
    g.add_argument("--spec-k", type=int, default=4)
    g.add_argument("--vram-budget", dest="vram_budget_gb", type=float, default=0.0, help="GiB (0: all free)")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", "--temp", type=float, default=0.7, help="0 means greedy")
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repeat-penalty", type=float, default=1.0)
    s.add_argument("--repeat-last-n", type=int, default=64)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--max-tokens", type=int, default=512)
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


class OptionError(ValueError):
    """A flag whose value is outside what it can mean (the CLI prints it and exits 2)."""


def _check_ranges(a: argparse.Namespace) -> None:
    """Refuse values that argparse's types let through but no sampler or engine can use
    (NaN included: every comparison with it is false)."""
    rules = [
        ("--temperature", a.temperature, lambda v: 0 <= v <= 100, "0 (greedy) or more"),
        ("--top-p", a.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("--min-p", a.min_p, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--top-k", a.top_k, lambda v: v >= 0, "0 (off) or more"),
        ("--repeat-penalty", a.repeat_penalty, lambda v: 0 < v <= 100, "above 0 (1 is off)"),
        ("--repeat-last-n", a.repeat_last_n, lambda v: v >= 0, "0 or more"),
        ("--max-tokens", a.max_tokens, lambda v: v >= 1, "1 or more"),
        ("--ctx", a.n_ctx, lambda v: v >= 0, "0 (the model's) or more"),
        ("--spec-k", a.spec_k, lambda v: v >= 1, "1 or more"),
        ("--vram-budget", a.vram_budget_gb, lambda v: 0 <= v < float("inf"), "0 (all free) or more GiB"),
    ]
    for flag, value, ok, expected in rules:
        if not ok(value):
            raise OptionError(f"{flag} {value}: expected {expected}")


def options_from_args(a: argparse.Namespace) -> EngineOptions:
    _check_ranges(a)
    return EngineOptions(
        model=a.model,
        device=a.device,
        n_ctx=a.n_ctx,
        kv_cache=a.kv_cache,
        activations=a.activations,
        quantize=a.quantize,
        speculative=a.speculative,
        spec_k=a.spec_k,
        vram_budget_gb=a.vram_budget_gb,
        sampling=SamplingParams(
            temperature=a.temperature,
            top_k=a.top_k,
            top_p=a.top_p,
            min_p=a.min_p,
            repeat_penalty=a.repeat_penalty,
            repeat_last_n=a.repeat_last_n,
            seed=a.seed,
            max_tokens=a.max_tokens,
            stop=list(a.stop),
        ),
    )
