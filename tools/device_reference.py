"""On the GPU machine: an independent logits reference from transformers.

Random-initialised transformers models (Llama and Qwen3, a tiny one and one with the real
Qwen3-8B shape) are saved with ``save_pretrained`` (BF16) and loaded through our safetensors
loader into the CUDA runner.  transformers runs the same weights upcast to float32 (TF32 off).
Reported: relative L2 error of the final logits (our decode path, token by token; and our
tensor-core prefill path), and whether greedy decoding agrees for 32 steps.

    python3 tools/device_reference.py OUTDIR [--big] [--long] [--only=kind,kind]

--long adds the >= 32k context check: a tiny Qwen3 (max_position_embeddings 40960) over a
32,776-token prompt, compared on the last 1024 positions (decode path token by token over the
whole prompt, and the chunked tensor-core prefill).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def build(kind: str, out: Path, big: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind == "llama-tiny":
        cfg = AutoConfig.for_model("llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=False)
    elif kind == "qwen3-tiny":
        cfg = AutoConfig.for_model("qwen3", hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64, vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=True)
    elif kind == "qwen3-tiny-long":  # the >= 32k context check: a tiny model, a 32,776-token prompt
        cfg = AutoConfig.for_model("qwen3", hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64, vocab_size=4096, max_position_embeddings=40960,
                                   rope_theta=1000000.0, tie_word_embeddings=True, attn_implementation="sdpa")
    elif kind == "qwen3-8b":
        cfg = AutoConfig.for_model("qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                                   rope_theta=1000000.0, tie_word_embeddings=False)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return model


def main(outdir: str, big: bool = False, long: bool = False, only: tuple = ()) -> int:
    import cupy as cp
    import torch

    from bw24chat.api import SamplingParams
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.loaders import load_checkpoint
    from tests.model_factory import byte_level_tokenizer_json

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    kinds = ["llama-tiny", "qwen3-tiny"] + (["qwen3-8b"] if big else []) + (["qwen3-tiny-long"] if long else [])
    if only:
        kinds = [k for k in kinds if k in only]
    for kind in kinds:
        n_prompt, n_ctx = (32776, 33000) if kind.endswith("-long") else (40, 1024)
        tail = slice(n_prompt - 1024, n_prompt) if kind.endswith("-long") else slice(0, n_prompt)
        d = Path(outdir) / kind
        t0 = time.time()
        model = build(kind, d, big)
        byte_level_tokenizer_json(d / "tokenizer.json")  # our loader wants a tokenizer; the ids are random anyway
        model = model.float().eval()
        V = model.config.vocab_size
        rng = np.random.default_rng(1)
        prompt = rng.integers(0, V, n_prompt)
        with torch.no_grad():
            ref_logits = model(torch.tensor(prompt[None], device="cuda")).logits[0, tail].double().cpu().numpy()
            gen = model.generate(torch.tensor(prompt[None], device="cuda"), max_new_tokens=32, do_sample=False,
                                 attention_mask=torch.ones(1, len(prompt), device="cuda", dtype=torch.long), eos_token_id=None, pad_token_id=0)
            ref_tokens = gen[0, len(prompt):].tolist()
        del model
        torch.cuda.empty_cache()
        ck = load_checkpoint(d)
        # float32 activations and cache: the comparison with transformers in float32 (1e-3); the
        # default bf16 cache, and the opt-in bf16 activations, for the record
        for kv, act in (("f32", "f32"), ("bf16", "f32"), ("f32", "bf16")):
            r = CudaRunner(ck, n_ctx, kv, activations=act)
            dec = [r.decode_logits(int(t), i) for i, t in enumerate(prompt)]
            dec = np.stack(dec[tail])
            pre = r.prefill_logits(prompt, 0)[tail].astype(np.float64)
            rel_dec = float(np.linalg.norm(dec - ref_logits) / np.linalg.norm(ref_logits))
            rel_pre = float(np.linalg.norm(pre - ref_logits) / np.linalg.norm(ref_logits))
            # greedy 32 on the decode path
            tok = int(np.argmax(dec[-1]))
            ours = [tok]
            for i in range(31):
                tok = int(np.argmax(r.decode_logits(tok, len(prompt) + i)))
                ours.append(tok)
            same = next((i for i, (x, y) in enumerate(zip(ours, ref_tokens)) if x != y), 32)
            rows.append(dict(model=kind, kv=kv, activations=act, rel_l2_decode=rel_dec, rel_l2_prefill=rel_pre, greedy_equal_steps=same,
                             seconds=time.time() - t0))
            print(json.dumps(rows[-1]), flush=True)
            del r
            cp.get_default_memory_pool().free_all_blocks()
    print(f"\n{'model':12} {'kv':5} {'x':5} {'rel L2 decode':>14} {'rel L2 prefill':>15} {'greedy equal':>13}")
    for x in rows:
        print(f"{x['model']:12} {x['kv']:5} {x['activations']:5} {x['rel_l2_decode']:14.2e} {x['rel_l2_prefill']:15.2e} {x['greedy_equal_steps']:>10}/32")
    return 0


if __name__ == "__main__":
    only = tuple(a.split("=", 1)[1] for a in sys.argv if a.startswith("--only="))
    only = tuple(x for o in only for x in o.split(","))
    sys.exit(main(sys.argv[1], "--big" in sys.argv, "--long" in sys.argv, only))
