"""On the GPU machine: an independent logits reference from transformers.

Random-initialised transformers models (Llama and Qwen3, a tiny one and one with the real
Qwen3-8B shape) are saved with ``save_pretrained`` (BF16) and loaded through our safetensors
loader into the CUDA runner.  transformers runs the same weights upcast to float32 (TF32 off).
Reported: relative L2 error of the final logits (our decode path, token by token; and our
tensor-core prefill path), and whether greedy decoding agrees for 32 steps.

The hybrid families (Qwen3-Next, Qwen3.5, Qwen3.5-MoE: gated DeltaNet + gated attention) run on
the NumPy backend (float32: "decode" is the runner one token at a time, "prefill" one pass over
the prompt) and on the CUDA runner as above (the MoE ones' gated shared expert included).  Tiny
ones by default; --big adds the real widths of Qwen3-Next-80B-A3B, Qwen3.5-9B and Qwen3.5-35B-A3B
(transformers' config defaults) cut to 4 layers (3 DeltaNet + 1 attention), as NumPy would take
too long over all of them (the MoE ones still hold 26 / 13 GB of float32 experts in host memory).

    python3 tools/device_reference.py OUTDIR [--big] [--long] [--moe] [--only=kind,kind]

--moe adds the mixture-of-experts families: tiny Qwen3MoeForCausalLM (a dense layer among the
sparse ones), Glm4MoeForCausalLM (group-limited routing, a selection bias, routed_scaling_factor,
a shared expert, a dense first layer, q/k/v biases, per-head QK-norm, partial RoPE) and
MiniMaxM2ForCausalLM (full-width QK-norm, a selection bias, partial RoPE); with --big also the
real Qwen3-30B-A3B layer shape, 4 of its 48 layers.  Every MoE entry first checks that our config
parser reads the saved config.json as transformers does (moe_args_mismatches).

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


_TINY_LINEAR = dict(linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
                    linear_conv_kernel_dim=4)
_TINY_MOE = dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=128)
_TINY_HYBRID = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                    vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=False,
                    layer_types=["linear_attention", "full_attention"] * 2, **_TINY_LINEAR)
# the real shapes (transformers' config defaults are the released models': Qwen3NextConfig
# Qwen3-Next-80B-A3B, Qwen3_5TextConfig Qwen3.5-9B, Qwen3_5MoeTextConfig Qwen3.5-35B-A3B), 4 layers
_REAL = dict(num_hidden_layers=4, max_position_embeddings=4096, rope_theta=10000000.0, partial_rotary_factor=0.25)
# kind -> (model_type, config) for AutoConfig.for_model; these run on the NumPy backend (module docstring)
HYBRID = {
    "qwen3-next-tiny": ("qwen3_next", dict(_TINY_HYBRID, intermediate_size=512, mlp_only_layers=[2], **_TINY_MOE)),
    "qwen3.5-tiny": ("qwen3_5_text", dict(_TINY_HYBRID, intermediate_size=768)),
    "qwen3.5-moe-tiny": ("qwen3_5_moe_text", dict(_TINY_HYBRID, **_TINY_MOE)),
    "qwen3-next-80b-a3b-4l": ("qwen3_next", _REAL),
    "qwen3.5-9b-4l": ("qwen3_5_text", _REAL),
    "qwen3.5-35b-a3b-4l": ("qwen3_5_moe_text", _REAL),
}


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
    elif kind in MOE_KINDS:
        cfg = moe_config(kind)
    elif kind in HYBRID:
        model_type, settings = HYBRID[kind]
        cfg = AutoConfig.for_model(model_type, **settings)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    if kind in MOE_KINDS:
        prepare_moe(model)
    model.save_pretrained(out, safe_serialization=True)
    return model


# ----------------------------------------------------------------------------- mixture of experts
# transformers 5.x config keys (configuration_qwen3_moe.py, configuration_glm4_moe.py,
# configuration_minimax_m2.py): rope settings go in rope_parameters (partial_rotary_factor
# included); head_dim is no declared field of Qwen3MoeConfig / Glm4MoeConfig but their attention
# reads it (getattr), as the released config.json files give it; Qwen3MoeConfig's norm_topk_prob
# defaults to False, every Qwen3-MoE release sets it.
MOE_KINDS = ("qwen3-moe-tiny", "glm4-moe-tiny", "minimax-m2-tiny", "qwen3-30b-a3b-4l")
_MOE_TINY = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                 vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=False)


def moe_config(kind: str):
    from transformers import AutoConfig

    rope = lambda theta, partial=1.0: {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}  # noqa: E731
    if kind == "qwen3-moe-tiny":
        return AutoConfig.for_model("qwen3_moe", **_MOE_TINY, intermediate_size=512, num_experts=16, num_experts_per_tok=4,
                                    moe_intermediate_size=128, norm_topk_prob=True, mlp_only_layers=[1],
                                    rope_parameters=rope(1e6))
    if kind == "glm4-moe-tiny":
        return AutoConfig.for_model("glm4_moe", **_MOE_TINY, intermediate_size=512, n_routed_experts=16, num_experts_per_tok=4,
                                    moe_intermediate_size=128, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
                                    topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True,
                                    use_qk_norm=True, num_nextn_predict_layers=0, rope_parameters=rope(1e6, 0.5))
    if kind == "minimax-m2-tiny":
        return AutoConfig.for_model("minimax_m2", **_MOE_TINY, intermediate_size=128, num_local_experts=16,
                                    num_experts_per_tok=4, bos_token_id=None, eos_token_id=None,
                                    rope_parameters=rope(5e6, 0.5))
    if kind == "qwen3-30b-a3b-4l":  # Qwen/Qwen3-30B-A3B config.json, 4 layers
        return AutoConfig.for_model("qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                                    num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                                    max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                                    rope_parameters=rope(1e6))
    raise ValueError(kind)


def prepare_moe(model) -> None:
    """The sigmoid routers' selection bias is a buffer initialised to zeros: give it values (small
    enough that every biased score stays positive, where transformers' 0.0 group mask and our -inf
    agree: ops.RouterSpec), so that selection and weights differ.  The transformers side runs its
    reference expert loop ("eager")."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_((0.05 * torch.randn(buf.shape, generator=g)).to(buf.dtype))
    model.set_experts_implementation("eager")


def moe_args_mismatches(ck, hf_config) -> list[str]:
    """Where our reading of the saved config.json (the family's ModelArgs) differs from the
    transformers config the model was built from."""
    from bw24chat.models import get_family

    a = get_family(ck.arch).ModelArgs.from_dict(ck.config)
    c = hf_config
    rp = getattr(c, "rope_parameters", None) or {}
    want = dict(head_dim=getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
                partial_rotary_factor=rp.get("partial_rotary_factor", 1.0), rope_theta=rp.get("rope_theta"),
                num_experts=getattr(c, "n_routed_experts", None) or c.num_experts, num_experts_per_tok=c.num_experts_per_tok)
    if ck.arch == "qwen3_moe":
        want.update(norm_topk_prob=c.norm_topk_prob, mlp_only_layers=list(c.mlp_only_layers), scoring_func="softmax")
    if ck.arch == "glm4_moe":
        want.update(n_group=c.n_group, topk_group=c.topk_group, routed_scaling_factor=c.routed_scaling_factor,
                    n_shared_experts=c.n_shared_experts, first_k_dense_replace=c.first_k_dense_replace,
                    norm_topk_prob=c.norm_topk_prob, attention_bias=c.attention_bias, scoring_func="sigmoid")
    if ck.arch == "minimax_m2":  # the router always renormalizes and never scales (MiniMaxM2TopKRouter)
        want.update(moe_intermediate_size=c.intermediate_size, norm_topk_prob=True, routed_scaling_factor=1.0,
                    scoring_func="sigmoid")
    if ck.arch != "minimax_m2":
        want.update(moe_intermediate_size=c.moe_intermediate_size)
    return [f"{k}: ours {getattr(a, k)!r}, transformers {v!r}" for k, v in want.items() if getattr(a, k) != v]


def numpy_reference(ck, prompt, ref_logits, ref_tokens, n_ctx: int) -> dict:
    """The NumPy backend against transformers' logits and greedy tokens: decode one token at a
    time, prefill in one pass (a fresh runner over the same weights), greedy 32 on the decode path."""
    from bw24chat.backends.numpy_backend import NumpyRunner, numpy_runner

    r = numpy_runner(ck, n_ctx)
    dec = np.concatenate([r.forward([int(t)], i) for i, t in enumerate(prompt)]).astype(np.float64)
    tok = int(np.argmax(dec[-1]))
    ours = [tok]
    for i in range(31):
        tok = int(np.argmax(r.forward([tok], len(prompt) + i)[0]))
        ours.append(tok)
    pre = NumpyRunner(r.model, r.backend).prefill_logits(prompt, 0).astype(np.float64)
    rel = lambda x: float(np.linalg.norm(x - ref_logits) / np.linalg.norm(ref_logits))  # noqa: E731
    same = next((i for i, (x, y) in enumerate(zip(ours, ref_tokens)) if x != y), 32)
    return dict(backend="numpy", rel_l2_decode=rel(dec), rel_l2_prefill=rel(pre), greedy_equal_steps=same)


def cuda_reference(ck, kv: str, act: str, prompt, tail, ref_logits, ref_tokens, n_ctx: int) -> dict:
    """The CUDA runner against transformers' logits and greedy tokens: the decode path token by
    token, the chunked tensor-core prefill, greedy 32 on the decode path."""
    from bw24chat.backends.cuda_runner import CudaRunner

    r = CudaRunner(ck, n_ctx, kv, activations=act)
    dec = [r.decode_logits(int(t), i) for i, t in enumerate(prompt)]
    dec = np.stack(dec[tail])
    pre = r.prefill_logits(prompt, 0)[tail].astype(np.float64)
    rel = lambda x: float(np.linalg.norm(x - ref_logits) / np.linalg.norm(ref_logits))  # noqa: E731
    tok = int(np.argmax(dec[-1]))
    ours = [tok]
    for i in range(31):
        tok = int(np.argmax(r.decode_logits(tok, len(prompt) + i)))
        ours.append(tok)
    same = next((i for i, (x, y) in enumerate(zip(ours, ref_tokens)) if x != y), 32)
    return dict(backend="cuda", rel_l2_decode=rel(dec), rel_l2_prefill=rel(pre), greedy_equal_steps=same)


def main(outdir: str, big: bool = False, long: bool = False, only: tuple = (), moe: bool = False) -> int:
    import cupy as cp
    import torch

    from bw24chat.loaders import load_checkpoint
    from tests.model_factory import byte_level_tokenizer_json

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    kinds = ["llama-tiny", "qwen3-tiny", "qwen3-next-tiny", "qwen3.5-tiny", "qwen3.5-moe-tiny"]
    kinds += ["qwen3-8b", "qwen3-next-80b-a3b-4l", "qwen3.5-9b-4l", "qwen3.5-35b-a3b-4l"] if big else []
    kinds += ["qwen3-tiny-long"] if long else []
    if moe:
        kinds += [k for k in MOE_KINDS if big or not k.endswith("-4l")]
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
        hf_config = model.config
        del model
        torch.cuda.empty_cache()
        ck = load_checkpoint(d)
        if kind in MOE_KINDS:
            bad = moe_args_mismatches(ck, hf_config)
            if bad:
                rows.append(dict(model=kind, config_mismatches=bad))
                print(json.dumps(rows[-1]), flush=True)
                continue
        if kind in HYBRID:
            rows.append(dict(model=kind, kv="f32", activations="f32", **numpy_reference(ck, prompt, ref_logits, ref_tokens, n_ctx),
                             seconds=time.time() - t0))
            print(json.dumps(rows[-1]), flush=True)
        # float32 activations and cache: the comparison with transformers in float32 (1e-3); the
        # default bf16 cache, and the opt-in bf16 activations, for the record
        for kv, act in (("f32", "f32"), ("bf16", "f32"), ("f32", "bf16")):
            try:
                row = cuda_reference(ck, kv, act, prompt, tail, ref_logits, ref_tokens, n_ctx)
            except NotImplementedError as exc:  # a configuration the CUDA backend refuses: reported as a row
                rows.append(dict(model=kind, kv=kv, activations=act, backend="cuda", missing=str(exc)))
                print(json.dumps(rows[-1]), flush=True)
                break
            finally:
                cp.get_default_memory_pool().free_all_blocks()
            rows.append(dict(model=kind, kv=kv, activations=act, **row, seconds=time.time() - t0))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'model':22} {'backend':7} {'kv':5} {'x':5} {'rel L2 decode':>14} {'rel L2 prefill':>15} {'greedy equal':>13}")
    for x in rows:
        if "config_mismatches" in x:
            print(f"{x['model']:22} config read differently: {'; '.join(x['config_mismatches'])}")
            continue
        if "missing" in x:
            print(f"{x['model']:22} {x['backend']:7} not run: {x['missing']}")
            continue
        print(f"{x['model']:22} {x['backend']:7} {x['kv']:5} {x['activations']:5} {x['rel_l2_decode']:14.2e} "
              f"{x['rel_l2_prefill']:15.2e} {x['greedy_equal_steps']:>10}/32")
    return 0


if __name__ == "__main__":
    only = tuple(a.split("=", 1)[1] for a in sys.argv if a.startswith("--only="))
    only = tuple(x for o in only for x in o.split(","))
    sys.exit(main(sys.argv[1], "--big" in sys.argv, "--long" in sys.argv, only, "--moe" in sys.argv))
