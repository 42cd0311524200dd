"""Sampling defaults per model: what the model recommends, else conservative values.

A Hugging Face folder recommends through its ``generation_config.json``.  A GGUF file carries
no sampling metadata, so the published recommendation of its family applies (matched on the
file and model name).  What a recommendation leaves out takes the conservative value: SmolLM2's
card names only temperature 0.2 and top-p 0.9, and without a repeat penalty the ~10 % of its
replies that start off course ("L'Étoile, la Cité, ...") loop until max_tokens.  Values the
user sets (flags, settings, request fields) win.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from .api import SamplingParams

# No recommendation: a low temperature, a truncated tail and a mild repeat penalty, which keep
# small models on topic.  SmolLM2-135M, "What is the capital of France?", 20-40 seeds: Paris in
# 11/20 at the old 0.7 / untruncated / no penalty, 14/20 at temperature 0.6 with the rest of these,
# 32/40 at 0.3 (the others mostly begin "L'Étoile (The City) - The capital of France...").
CONSERVATIVE = dict(temperature=0.3, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1)

# (name pattern, values, where they come from), first match wins
FAMILIES = (
    (r"smollm2", dict(temperature=0.2, top_p=0.9), "the SmolLM2 model card"),
    (r"qwen3", dict(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0), "Qwen3's generation_config.json"),
    (r"qwen2\.5", dict(temperature=0.7, top_p=0.8, top_k=20, repeat_penalty=1.05), "Qwen2.5's generation_config.json"),
    (r"llama[-_ ]?3", dict(temperature=0.6, top_p=0.9), "Llama 3's generation_config.json"),
)
_HF_KEYS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repetition_penalty": "repeat_penalty"}


def _from_generation_config(cfg: dict) -> dict:
    values = {ours: cfg[theirs] for theirs, ours in _HF_KEYS.items() if isinstance(cfg.get(theirs), (int, float))}
    if cfg.get("do_sample") is False:  # transformers then decodes greedily whatever the other keys say
        values["temperature"] = 0.0
    return values


def model_sampling(checkpoint) -> tuple[dict, str]:
    """(temperature, top_k, top_p, min_p, repeat_penalty) for ``checkpoint``, and their source."""
    found = _from_generation_config(checkpoint.generation_config or {})
    if found:
        return {**CONSERVATIVE, **found}, "the model's generation_config.json"
    name = f"{getattr(checkpoint.path, 'name', '')} {checkpoint.name}".lower()
    for pattern, values, source in FAMILIES:
        if re.search(pattern, name):
            return {**CONSERVATIVE, **values}, source
    return dict(CONSERVATIVE), "bw24chat's conservative defaults"


def effective_sampling(sp: SamplingParams, chosen: Iterable[str], defaults: dict) -> SamplingParams:
    """``sp`` with every model-tunable value the user did not choose taken from ``defaults``."""
    chosen = set(chosen)
    return dataclasses.replace(sp, **{k: v for k, v in defaults.items() if k not in chosen}, stop=list(sp.stop))


def sampling_summary(sp: SamplingParams) -> dict:
    """The values that decide the tokens, for --json and the UI."""
    keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "stop_on_loop", "max_tokens")
    return {k: getattr(sp, k) for k in keys}
