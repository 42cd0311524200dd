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
    vram_budget_gb: float = 0.0  # 0: all free VRAM
    max_queue: int = 64
    spec: str = "off"  # speculative decoding: off | ngram (speculative.py)
    spec_k: int = 0  # drafts per step, 1..MAX_K; 0: adaptive
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
    add_spec_args(p)


def add_spec_args(p: argparse.ArgumentParser) -> None:
    from .speculative import MAX_K, SPEC_MODES

    def mode(text: str) -> str:
        if text == "mtp":
            raise argparse.ArgumentTypeError("mtp needs a model with a multi-token-prediction head; none loads one yet")
        return text

    def k(text: str) -> int:
        if text == "auto":
            return 0
        if not text.isdigit() or not 1 <= int(text) <= MAX_K:
            raise argparse.ArgumentTypeError(f"{text!r}: 1..{MAX_K} or auto")
        return int(text)

    g = p.add_argument_group("speculative decoding (the same tokens as without, faster when drafts are accepted)")
    g.add_argument("--spec", type=mode, choices=SPEC_MODES, default="off",
                   help="ngram: draft the continuation of the longest recent n-gram match in the prompt and reply")
    g.add_argument("--spec-k", type=k, default=0, metavar=f"{{1..{MAX_K},auto}}",
                   help="drafts per step (default auto: fewer while drafts are rejected)")


def options_from_args(a: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        model=a.model,
        device=a.device,
        n_ctx=a.n_ctx,
        kv_cache=a.kv_cache,
        activations=a.activations,
        quantize=a.quantize,
        vram_budget_gb=a.vram_budget_gb,
        spec=a.spec,
        spec_k=a.spec_k,
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
