"""Random-weight checkpoints of real model shapes, for benchmarks and checks of shapes too large
to carry, in any weight format without a quantizer: quantized formats get random *valid* blocks
(random codes, scales drawn in a sane range), so every byte a real model would read is read.

Layers share one set of host arrays (each is uploaded to its own device buffer, so device reads
are still distinct and never served from L2); the logits are therefore meaningless but the work
per token is exactly a real model's.  MoE shapes get E experts that are row-shifted windows of
one random matrix (distinct contents, one expert's generation cost; shared across layers the
same way) and an F32 router (llama.cpp keeps ``ffn_gate_inp`` unquantized).
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from tokenizers import Tokenizer, models, pre_tokenizers

from . import quants
from .loaders import Checkpoint
from .loaders.tensor import ExpertTensor, QTensor
from .models import get_family
from .tokenizer import TokenizerInfo

_QWEN3_8B = dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=49152,
                 max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
# the weight formats synthetic_checkpoint makes (check gates and benchmarks them), lower case as typed
FORMATS = ("bf16", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "nvfp4", "mxfp4", "q2_k",
           "q3_k", "q4_k_m")
# llama.cpp's K-quant mixes, what most GGUF downloads are (llama-quant.cpp llama_tensor_get_type):
# the base format; attn_v and ffn_down on the use_more_bits layers and the output matrix in Q6_K
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K")}


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp use_more_bits: the layers a K-quant mix gives more bits (first and last
    eighth, every third between)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
_TINY = dict(model_type="qwen3", hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
             num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=4096,
             max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
_TINY_QWEN35 = {**_TINY, "model_type": "qwen3_5", "num_hidden_layers": 4, "full_attention_interval": 2,
                "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 6,
                "linear_v_head_order": "tiled"}
SHAPES = {
    # Qwen3-8B with a 49k vocabulary: the shape llama.cpp was measured on (engine notes)
    "qwen3-8b": _QWEN3_8B,
    "qwen3-8b-151k": {**_QWEN3_8B, "vocab_size": 151936},  # the real vocabulary
    "llama3-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                      max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): the shape of llama.cpp's MoE figures (engine notes)
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    # GLM-4.5-Air (zai-org/GLM-4.5-Air config.json): 1 dense layer, 128 experts + 1 shared, no QK-norm
    "glm-4.5-air": dict(model_type="glm4_moe", hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
                        num_attention_heads=96, num_key_value_heads=8, head_dim=128, vocab_size=151552,
                        max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        attention_bias=True, partial_rotary_factor=0.5, n_routed_experts=128, num_experts_per_tok=8,
                        moe_intermediate_size=1408, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, norm_topk_prob=True),
    # MiniMax-M2 (MiniMaxAI/MiniMax-M2 config.json): 256 experts of 1536, full-width QK-norm, rotary_dim 64
    "minimax-m2": dict(model_type="minimax_m2", hidden_size=3072, intermediate_size=1536, num_hidden_layers=62,
                       num_attention_heads=48, num_key_value_heads=8, head_dim=128, vocab_size=200064,
                       max_position_embeddings=196608, rope_theta=5000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       num_local_experts=256, num_experts_per_tok=8, rotary_dim=64),
    # Qwen3.5-9B (transformers' Qwen3_5TextConfig defaults, slime's qwen3.5 scripts): 24 gated DeltaNet
    # layers (16 key / 32 value heads of 128) and 8 gated attention layers (head dim 256, 25 % rotary)
    "qwen3.5-9b": dict(model_type="qwen3_5", hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=256, vocab_size=248320,
                       max_position_embeddings=262144, rope_theta=10000000.0, partial_rotary_factor=0.25,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, full_attention_interval=4,
                       linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_num_key_heads=16, linear_num_value_heads=32),
    # the Qwen3.5 / Qwen3.6 hybrid MoE (35B-A3B): the 9B's layer pattern at hidden 2048, 256 routed
    # experts (top-8) and a gated shared expert in every layer, 2 KV heads of 256
    "qwen3.5-35b-a3b": dict(model_type="qwen3_5_moe", hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, vocab_size=248320, max_position_embeddings=262144,
                            rope_theta=10000000.0, partial_rotary_factor=0.25, rms_norm_eps=1e-6,
                            tie_word_embeddings=False, full_attention_interval=4, linear_conv_kernel_dim=4,
                            linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                            linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512),
    "tiny": _TINY,
    "tiny-moe": {**_TINY, "model_type": "qwen3_moe", "num_experts": 16, "num_experts_per_tok": 4,
                 "moe_intermediate_size": 256, "norm_topk_prob": True},
    # the sigmoid-router families at gate size (their real shapes exceed any one GPU): GLM-4.5's
    # groups, scaling, shared expert, dense first layer, biases and partial RoPE; MiniMax-M2's
    # full-width QK-norm and partial RoPE
    "tiny-glm4-moe": {**_TINY, "model_type": "glm4_moe", "n_routed_experts": 16, "num_experts_per_tok": 4,
                      "moe_intermediate_size": 256, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4,
                      "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "attention_bias": True,
                      "partial_rotary_factor": 0.5},
    "tiny-minimax-m2": {**_TINY, "model_type": "minimax_m2", "num_local_experts": 16, "num_experts_per_tok": 4,
                        "intermediate_size": 256, "rotary_dim": 32},
    # the hybrid's gates: Qwen3.5's block, DeltaNet and gated attention layers alternating, the real
    # DeltaNet head dims over fewer heads (3 value heads per key head, tiled as llama.cpp's files);
    # Qwen3.5-MoE's: every layer's FFN routed (softmax top-k) plus a gated shared expert
    "tiny-qwen3.5": _TINY_QWEN35,
    "tiny-qwen3.5-moe": {**_TINY_QWEN35, "model_type": "qwen3_5_moe", "num_experts": 16, "num_experts_per_tok": 4,
                         "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256},
}


def _f16_bytes(rng, n, lo, hi) -> np.ndarray:
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_matrix(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> QTensor:
    """A random valid tensor in ``fmt`` with values of magnitude ~0.01-0.05 (logits stay sane)."""
    if fmt == "BF16":
        bits = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16)
        bits = (bits & 0x807F) | np.uint16(121 << 7)  # +-[1, 2) * 2^-6
        return QTensor("", "BF16", (rows, cols), bits)
    if fmt == "F16":
        return QTensor("", "F16", (rows, cols), (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16))
    qt = T[fmt]
    bs, ts = quants.block_info(qt)
    nb = rows * (cols // bs)
    raw = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
    # overwrite the scale fields with sane values (layouts in quants.py)
    if fmt in ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL"):
        raw[:, 0:2] = _f16_bytes(rng, nb, 2e-4, 2e-3) if fmt == "Q8_0" else _f16_bytes(rng, nb, 2e-3, 6e-3)
    elif fmt in ("Q4_1", "Q5_1"):
        raw[:, 0:2] = _f16_bytes(rng, nb, 2e-3, 6e-3)
        raw[:, 2:4] = _f16_bytes(rng, nb, -0.04, -0.02)
    elif fmt in ("Q4_K", "Q5_K"):
        raw[:, 0:2] = _f16_bytes(rng, nb, 1e-4, 3e-4)
        raw[:, 2:4] = _f16_bytes(rng, nb, 1e-4, 3e-4)
    elif fmt == "Q6_K":
        raw[:, 208:210] = _f16_bytes(rng, nb, 1e-5, 4e-5)
    elif fmt == "Q2_K":
        raw[:, 80:82] = _f16_bytes(rng, nb, 5e-4, 1.5e-3)
        raw[:, 82:84] = _f16_bytes(rng, nb, 5e-4, 1.5e-3)
    elif fmt == "Q3_K":
        raw[:, 108:110] = _f16_bytes(rng, nb, 1e-4, 4e-4)
    elif fmt == "NVFP4":
        raw[:, 0:4] = rng.integers(0x18, 0x28, (nb, 4), dtype=np.uint8)  # E4M3 scales ~ 2^-4..2^-2
    elif fmt == "MXFP4":
        raw[:, 0] = rng.integers(119, 122, nb, dtype=np.uint8)  # e8m0 scales 2^-8..2^-6
    else:
        raise ValueError(f"no synthetic generator for {fmt}")
    return QTensor("", fmt, (rows, cols), raw.reshape(rows, -1), global_scale=0.05 if fmt == "NVFP4" else 1.0)


def random_experts(fmt: str, n: int, rows: int, cols: int, rng: np.random.Generator) -> list[QTensor]:
    """n (rows, cols) experts: expert e is rows e .. e + rows - 1 of one (rows + n, cols) random matrix."""
    m = random_matrix(fmt, rows + n, cols, rng)
    return [QTensor("", fmt, (rows, cols), m.raw[e:e + rows], m.global_scale) for e in range(n)]


def synthetic_checkpoint(shape: str | dict, fmt: str = "BF16", seed: int = 0, embed_fmt: str | None = None,
                         mtp: bool = False) -> Checkpoint:
    """A random-weight checkpoint of ``shape`` (a SHAPES name or a config dict).  Hybrid families
    (gated DeltaNet + gated attention, models/qwen3_next.py) get their linear-attention layers
    (F32 conv taps, decay and bias vectors); ``num_nextn_predict_layers`` (``mtp``: one) adds
    NextN / MTP layers (Checkpoint.mtp; models/mtp.py) after the trunk, drawn after it, so the
    trunk's weights are the same with or without them."""
    cfg = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    cfg["rope_style"] = "neox"
    mix, fmt = fmt, MIXES.get(fmt, (fmt,))[0]  # a mix: its base format here, its Q6_K tensors below
    if mtp:
        cfg["num_nextn_predict_layers"] = 1
    rng = np.random.default_rng(seed)
    D, F, L = cfg["hidden_size"], cfg.get("intermediate_size"), cfg["num_hidden_layers"]  # F: dense FFN layers only
    H, K, hd, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]
    mt = cfg["model_type"]
    args = get_family(mt).ModelArgs.from_dict(cfg)
    hybrid = hasattr(args, "deltanet_spec")
    n_mtp = cfg.get("num_nextn_predict_layers") or 0
    layers = range(L + n_mtp)
    moe = [getattr(args, "is_moe_layer", lambda i: False)(i) for i in layers]
    ones = lambda n: QTensor("", "F32", (n,), (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))  # noqa: E731
    small = lambda *s: QTensor("", "F32", s, (0.02 * rng.standard_normal(s)).astype(np.float32))  # noqa: E731
    attn = {  # a hybrid's q projection is twice as wide: per head [q | output gate]
        "attn_q": random_matrix(fmt, (2 if hybrid else 1) * H * hd, D, rng), "attn_k": random_matrix(fmt, K * hd, D, rng),
        "attn_v": random_matrix(fmt, K * hd, D, rng), "attn_o": random_matrix(fmt, D, H * hd, rng),
    }
    if hybrid:
        s = args.deltanet_spec()
        vd, Hv = s.n_v_heads * s.v_head_dim, s.n_v_heads
        linear = {"attn_qkv": random_matrix(fmt, s.conv_dim, D, rng), "attn_gate": random_matrix(fmt, vd, D, rng),
                  "ssm_beta": random_matrix(fmt, Hv, D, rng), "ssm_alpha": random_matrix(fmt, Hv, D, rng),
                  "ssm_out": random_matrix(fmt, D, vd, rng),
                  "ssm_conv1d": QTensor("", "F32", (s.conv_dim, s.conv_kernel),
                                        (0.3 * rng.standard_normal((s.conv_dim, s.conv_kernel))).astype(np.float32)),
                  "ssm_a": QTensor("", "F32", (Hv,), -rng.uniform(0.05, 2.0, Hv).astype(np.float32)),  # -exp(A_log)
                  "ssm_dt": ones(Hv), "ssm_norm": ones(s.v_head_dim)}
    dense = {}
    if not all(moe):
        dense = dict(ffn_gate=random_matrix(fmt, F, D, rng), ffn_up=random_matrix(fmt, F, D, rng),
                     ffn_down=random_matrix(fmt, D, F, rng))
    if any(moe):
        E, Fe = args.num_experts, args.moe_intermediate_size
        experts = {"ffn_gate_exps": random_experts(fmt, E, Fe, D, rng), "ffn_up_exps": random_experts(fmt, E, Fe, D, rng),
                   "ffn_down_exps": random_experts(fmt, E, D, Fe, rng)}
        router = small(E, D)
        Fs = args.shared_expert_intermediate_size or Fe * args.n_shared_experts  # Qwen-style gated, or GLM-style
        shexp = {}
        if Fs:
            shexp = {"ffn_gate_shexp": random_matrix(fmt, Fs, D, rng), "ffn_up_shexp": random_matrix(fmt, Fs, D, rng),
                     "ffn_down_shexp": random_matrix(fmt, D, Fs, rng)}
        if args.shared_expert_intermediate_size:
            shexp["ffn_gate_inp_shexp"] = small(D)
    tensors = {"tok_embd": random_matrix(embed_fmt or fmt, V, D, rng), "output_norm": ones(D)}
    mtp: dict = {}
    if not cfg.get("tie_word_embeddings"):
        tensors["output"] = random_matrix(embed_fmt or fmt, V, D, rng)
    for i in layers:
        out, p = tensors if i < L else mtp, f"blk.{i}."
        lin = hybrid and args.is_linear(i)
        for k, v in {**(linear if lin else attn), **({} if moe[i] else dense)}.items():
            out[p + k] = QTensor(p + k, v.fmt, v.shape, v.raw, v.global_scale)
        out[p + "attn_norm"] = ones(D)
        out[p + "ffn_norm"] = ones(D)
        if not lin and (mt in ("qwen3", "qwen3_moe") or hybrid):
            out[p + "attn_q_norm"] = ones(hd)
            out[p + "attn_k_norm"] = ones(hd)
        if mt == "minimax_m2":  # QK-norm over the whole projections
            out[p + "attn_q_norm"] = ones(H * hd)
            out[p + "attn_k_norm"] = ones(K * hd)
        if cfg.get("attention_bias"):
            for n, rows in (("q", H * hd), ("k", K * hd), ("v", K * hd)):
                out[p + f"attn_{n}_bias"] = small(rows)
        if moe[i]:
            out[p + "ffn_gate_inp"] = QTensor("", "F32", router.shape, router.raw)
            for k, parts in experts.items():
                out[p + k] = ExpertTensor(p + k, parts)
            if args.scoring_func == "sigmoid":
                out[p + "exp_probs_b"] = small(E)
            for k, v in shexp.items():
                out[p + k] = QTensor("", v.fmt, v.shape, v.raw, v.global_scale)
        if i >= L:  # the NextN / MTP layer's own tensors (models/mtp.py)
            out[p + "nextn.eh_proj"] = random_matrix(fmt, D, 2 * D, rng)
            for k in ("enorm", "hnorm", "shared_head_norm"):
                out[p + "nextn." + k] = ones(D)
    if mix in MIXES:  # drawn last: the base tensors are the base format's own
        hi = MIXES[mix][1]
        more = {"attn_v": random_matrix(hi, K * hd, D, rng)}
        if dense:
            more["ffn_down"] = random_matrix(hi, D, F, rng)
        if any(moe):  # llama-quant.cpp's "ffn_down" rule matches ffn_down_exps too
            more["ffn_down_exps"] = random_experts(hi, E, D, Fe, rng)
        for i in range(L):
            for k, v in more.items():
                name = f"blk.{i}.{k}"
                if use_more_bits(i, L) and name in tensors:
                    tensors[name] = ExpertTensor(name, v) if k.endswith("_exps") else QTensor("", v.fmt, v.shape, v.raw, v.global_scale)
        if "output" in tensors and embed_fmt is None:
            tensors["output"] = random_matrix(hi, V, D, rng)
    for n, t in (*tensors.items(), *mtp.items()):
        t.name = n
    # a word per id ("t17"), so generated ids come out as text (engine-level load tests stream it)
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg["vocab_size"])}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Checkpoint(path=f"<synthetic {shape} {mix}>", source="synthetic",
                      name=f"synthetic-{shape}-{mix.lower()}" + ("-mtp" if n_mtp else ""),
                      config=cfg, tensors=tensors, tokenizer=TokenizerInfo(tk), mtp=mtp)
