"""Engine options shared by the TUI, the headless mode and the server (one set of flags), and the
flag vocabulary every subcommand shares (``-m``, ``--device``, ``--kv-cache``, ``--json``)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .api import SamplingParams
from .sampling import REPEAT_WINDOW_MAX

DEVICES = ("auto", "cpu", "cuda")
KV_CACHE_TYPES = ("bf16", "q8_0", "fp8", "f32")
# Sampling values a model may recommend: left unset, they come from the model (sampling_defaults).
MODEL_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
MODEL_HELP = ("GGUF file, Hugging Face model directory, repo id in the local HF cache (org/name, org/name:QUANT, "
              "org/name/FILE.gguf), or 'default' (SmolLM2-135M-Instruct Q4_1, fetched on first use)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """States every flag's default unless its help already speaks of one."""

    def _get_help_string(self, action):
        text = action.help or ""
        quiet = (None, False, argparse.SUPPRESS, [])
        if "default" not in text and action.default not in quiet and action.option_strings:
            text += " (default: %(default)s)"
        return text


def parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


def add_model_arg(p, help: str = MODEL_HELP, **kwargs) -> None:
    p.add_argument("-m", "--model", help=help, **kwargs)


def add_device_arg(p, help: str = "where to run: auto picks CUDA when CuPy and an NVIDIA GPU are usable, else the "
                                  "NumPy backend on the CPU") -> None:
    p.add_argument("--device", choices=DEVICES, default="auto", help=help)


def comma_list(choices: tuple[str, ...]):
    """An argparse type: a comma list whose every item is one of ``choices``."""

    def parse(text: str) -> list[str]:
        items = [s.strip().lower() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: each item must be one of {', '.join(choices)}")
        return items

    return parse


def comma_ints(text: str) -> list[int]:
    """An argparse type: a comma list of positive integers."""
    try:
        items = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas")
    return items


def gpu_ids(text: str) -> tuple[int, ...]:
    """An argparse type for --gpus: a count N (devices 0..N-1) or distinct device ids separated by
    commas (0,1)."""
    try:
        if "," in text:
            ids = tuple(int(s) for s in text.split(",") if s.strip())
            ok = bool(ids) and min(ids) >= 0 and len(set(ids)) == len(ids)
        else:
            ids = tuple(range(int(text)))
            ok = bool(ids)
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a GPU count (2) or distinct device ids separated by commas (0,1)")
    return ids


@dataclass
class EngineOptions:
    model: str | None = None  # GGUF path, HF directory, HF repo id in the local cache, or "default"
    device: str = "auto"  # auto | cpu | cuda
    gpus: tuple[int, ...] = ()  # CUDA devices one model is split over (parallel.py); (): the one default GPU
    n_ctx: int = 0  # 0: the model's own maximum (capped by memory on the device)
    kv_cache: str = "bf16"  # bf16 | q8_0 | fp8 | f32   (CUDA backend)
    activations: str = "f32"  # f32 | bf16: matmul inputs exact, or rounded to bf16 (CUDA backend)
    quantize: str | None = None  # re-encode weights at load: nvfp4 | q8_0
    vram_budget_gb: float = 0.0  # 0: all free VRAM
    host_budget_gb: float | None = None  # pinned host RAM for spilled MoE experts; None: auto
    threads: int = 1  # BLAS threads of the NumPy backend (docs/performance.md)
    max_queue: int = 64
    max_batch: int = 0  # sequences decoded together; 0: the backend's most (1: one request at a time)
    kv_pool: int = 0  # positions in the paged KV pool of batched decoding; 0: 1 GiB of K/V, at least one context
    spec: str = "off"  # speculative decoding: off | ngram | mtp (speculative.py)
    spec_k: int = 0  # drafts per step, 1..MAX_K; 0: adaptive
    draft_head: str | None = None  # a trained MTP head file (train_draft.py); None: the one beside the model
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # the MODEL_SAMPLING_KEYS the user chose; the others take the model's recommendation
    sampling_set: frozenset[str] = frozenset()


def batching(max_batch: int, spec: str | None) -> bool:
    """Whether an engine of these options decodes requests together where its runner can: not at
    --max-batch 1, nor with --spec mtp (the head drafts from one sequence's hidden states)."""
    return max_batch != 1 and spec != "mtp"


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    add_model_arg(g, help=MODEL_HELP + " (default: none: the app opens its model manager; --headless and serve use 'default')")
    add_device_arg(g)
    g.add_argument("--gpus", type=gpu_ids, default=(), metavar="N|IDS",
                   help="split the model over N GPUs of this host, or the devices listed (0,1): attention heads, MLP "
                        "units, experts and vocabulary divided among them (default: one GPU; 1 is the same)")
    g.add_argument("--ctx", dest="n_ctx", type=int, default=0, help="context length in tokens (default: 0, the model's)")
    g.add_argument("--kv-cache", choices=KV_CACHE_TYPES, default="bf16",
                   help="KV cache type on the GPU (f32: exact, 2x the bytes of bf16)")
    g.add_argument("--activations", choices=["f32", "bf16"], default="f32",
                   help="matmul inputs on the GPU: float32 (default: prefill and decode logits agree to ~1e-5) or "
                        "rounded to bf16 as bf16 engines do (prefill ~1.3-1.4x faster; the two paths then agree "
                        "to ~3e-3 and can pick different tokens at small margins)")
    g.add_argument("--quantize", choices=["nvfp4", "q8_0"], default=None, help="re-encode the weights at load (default: as stored)")
    add_budget_args(g)
    g.add_argument("--threads", type=int, default=1,
                   help="BLAS threads of the NumPy backend (1 was fastest on 2 cores, idle or busy: docs/performance.md)")
    g.add_argument("--max-batch", type=int, default=0, metavar="N",
                   help="requests decoded together where the backend batches (each one's tokens are the same as "
                        "alone; on the GPU its KV pool takes VRAM beside the context's cache, and where even one "
                        "context does not fit the engine serves one request at a time); 1: one request at a time "
                        "(default: 0, the backend's most)")
    g.add_argument("--kv-pool", type=int, default=0, metavar="TOKENS",
                   help="positions the batched engine's paged KV cache holds, shared by every request; prompt "
                        "prefixes stay cached there for later requests (default: 0, 1 GiB of K/V and at least --ctx)")
    s = p.add_argument_group("sampling (unset: the model's recommendation, else the conservative values shown)")
    from .sampling_defaults import CONSERVATIVE

    def model_default(key: str) -> str:
        return f"default: the model's, else {CONSERVATIVE[key]}"

    s.add_argument("--temperature", "--temp", type=float, default=None, help=f"0 means greedy ({model_default('temperature')})")
    s.add_argument("--top-k", type=int, default=None, help=f"keep the k most likely tokens, 0: off ({model_default('top_k')})")
    s.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling, 1: off ({model_default('top_p')})")
    s.add_argument("--min-p", type=float, default=None,
                   help=f"drop tokens below min-p times the top probability, 0: off ({model_default('min_p')})")
    s.add_argument("--repeat-penalty", type=float, default=None,
                   help=f"penalize tokens of the last --repeat-last-n, 1: off ({model_default('repeat_penalty')})")
    s.add_argument("--repeat-last-n", type=int, default=64, help="tokens the repeat penalty looks back over (0: none, at most 256)")
    s.add_argument("--stop-on-loop", type=int, default=0, metavar="N",
                   help="stop a reply once it has repeated the same phrase (up to 32 tokens) for N tokens (default: 0, off)")
    s.add_argument("--seed", type=int, default=None, help="sampling seed (default: a fresh random seed per reply)")
    s.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply")
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable; default: none)")
    add_spec_args(p)


def add_budget_args(g) -> None:
    """The memory budgets (the engine's and `bw24chat info`'s plan of where MoE experts live)."""
    g.add_argument("--vram-budget", dest="vram_budget_gb", type=float, default=0.0, help="GiB of VRAM to use (default: 0, all free)")
    g.add_argument("--host-budget", dest="host_budget_gb", type=float, default=None, metavar="GIB",
                   help="GiB of pinned host RAM for MoE experts that do not fit the VRAM budget; the rest are read "
                        "from the model file (default: auto, half the available memory; 0: none)")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    from .speculative import MAX_K, SPEC_MODES

    def k(text: str) -> int:
        if text == "auto":
            return 0
        if not text.isdigit() or not 1 <= int(text) <= MAX_K:
            raise argparse.ArgumentTypeError(f"{text!r}: 1..{MAX_K} or auto")
        return int(text)

    g = p.add_argument_group("speculative decoding (the same tokens as without, faster when drafts are accepted)")
    g.add_argument("--spec", choices=SPEC_MODES, default=None,
                   help="ngram: draft the continuation of the longest recent n-gram match in the prompt and reply; "
                        "mtp: the model's multi-token-prediction head, shipped or trained by bw24chat train-draft "
                        "(refused at load for a model without one) (default: off; mtp with --draft-head)")
    g.add_argument("--draft-head", metavar="FILE",
                   help="the MTP head file to use (bw24chat train-draft's; default: the one beside the model, if any); "
                        "implies --spec mtp; a head trained for another model is refused")
    g.add_argument("--spec-k", type=k, default=0, metavar=f"{{1..{MAX_K},auto}}",
                   help="drafts per step (default auto: the K that maximises the expected tokens per second, from the "
                        "acceptance so far and the measured step time per row count)")


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
        ("--repeat-last-n", a.repeat_last_n, lambda v: 0 <= v <= REPEAT_WINDOW_MAX, f"0 (none) to {REPEAT_WINDOW_MAX}"),
        ("--max-tokens", a.max_tokens, lambda v: v >= 1, "1 or more"),
        ("--ctx", a.n_ctx, lambda v: v >= 0, "0 (the model's) or more"),
        ("--stop-on-loop", a.stop_on_loop, lambda v: v >= 0, "0 (off) or more"),
        ("--threads", a.threads, lambda v: v >= 1, "1 or more"),
        ("--max-batch", a.max_batch, lambda v: v >= 0, "0 (the backend's most) or more"),
        ("--kv-pool", a.kv_pool, lambda v: v >= 0, "0 (automatic) or more"),
        ("--vram-budget", a.vram_budget_gb, lambda v: 0 <= v < float("inf"), "0 (all free) or more GiB"),
        ("--host-budget", a.host_budget_gb, lambda v: 0 <= v < float("inf"), "0 (none) or more GiB"),
    ]
    for flag, value, ok, expected in rules:
        if value is not None and not ok(value):  # None: the model's recommendation (sampling_defaults)
            raise OptionError(f"{flag} {value}: expected {expected}")


def options_from_args(a: argparse.Namespace) -> EngineOptions:
    _check_ranges(a)
    chosen = {k: getattr(a, k) for k in MODEL_SAMPLING_KEYS if getattr(a, k) is not None}
    return EngineOptions(
        model=a.model,
        device=a.device,
        gpus=a.gpus,
        n_ctx=a.n_ctx,
        kv_cache=a.kv_cache,
        activations=a.activations,
        quantize=a.quantize,
        vram_budget_gb=a.vram_budget_gb,
        host_budget_gb=a.host_budget_gb,
        threads=a.threads,
        max_batch=a.max_batch,
        kv_pool=a.kv_pool,
        spec=a.spec or ("mtp" if a.draft_head else "off"),
        spec_k=a.spec_k,
        draft_head=a.draft_head,
        sampling=SamplingParams(
            **chosen,
            repeat_last_n=a.repeat_last_n,
            stop_on_loop=a.stop_on_loop,
            seed=a.seed,
            max_tokens=a.max_tokens,
            stop=list(a.stop),
        ),
        sampling_set=frozenset(chosen),
    )
