"""Tiny random hybrid (gated DeltaNet + gated attention) checkpoints for tests: Qwen3-Next,
Qwen3.5 and Qwen3.5-MoE under transformers' tensor names (with an ``mtp.*`` head where asked),
and the same weights as a GGUF file written the way llama.cpp's converter writes them
(conversion/qwen.py Qwen3NextModel, _LinearAttentionVReorderBase, _Qwen35MtpMixin), transcribed
here independently of bw24chat's loaders."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tests.model_factory import TINY, byte_level_tokenizer_json, write_safetensors

ARCHS = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}
GGUF_ARCH = {"qwen3_next": "qwen3next", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe"}

_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=6, linear_num_key_heads=2,
               linear_num_value_heads=4)
_MOE = dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=24)
# layers linear, full, linear, full; partial rotary; Qwen3-Next with a dense layer (mlp_only_layers)
TINY_HYBRID = {
    "qwen3_next": dict(TINY, max_position_embeddings=2048, num_hidden_layers=4, full_attention_interval=2,
                       partial_rotary_factor=0.25, norm_topk_prob=True, mlp_only_layers=[2], **_LINEAR, **_MOE),
    "qwen3_5": dict(TINY, max_position_embeddings=2048, num_hidden_layers=4, full_attention_interval=2,
                    rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                     "mrope_interleaved": True, "rope_type": "default"}, **_LINEAR),
    "qwen3_5_moe": dict(TINY, max_position_embeddings=2048, num_hidden_layers=4, full_attention_interval=2,
                        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
                        **_LINEAR, **_MOE),
}


def hybrid_weights(cfg: dict, vocab: int, rng: np.random.Generator, n_mtp: int = 0) -> dict[str, np.ndarray]:
    """Random tensors under transformers' names: Qwen3-Next's in_proj_qkvz / in_proj_ba in their
    grouped layout, Qwen3.5's in_proj_qkv / _z / _b / _a; zero-centred norm weights near 0;
    ``n_mtp`` MTP layers (``mtp.*``, vLLM qwen3_next_mtp.py / qwen3_5_mtp.py names)."""
    from bw24chat.models import get_family

    fam = cfg["model_type"]
    a = get_family(fam).ModelArgs.from_dict(cfg)
    D, L, H, K, hd, F = a.hidden_size, a.num_hidden_layers, a.num_attention_heads, a.num_key_value_heads, a.head_dim, \
        a.intermediate_size
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)  # noqa: E731
    zn = lambda n: (0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    s = a.deltanet_spec()
    Hk, Hv, dk, dv = s.n_k_heads, s.n_v_heads, s.k_head_dim, s.v_head_dim
    t = {"model.embed_tokens.weight": w(vocab, D) * 10, "model.norm.weight": zn(D), "lm_head.weight": w(vocab, D)}
    for i in range(L + n_mtp):
        p = f"model.layers.{i}." if i < L else f"mtp.layers.{i - L}."
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = zn(D), zn(D)
        if i < L and a.is_linear(i):
            q = p + "linear_attn."
            if fam == "qwen3_next":
                t[q + "in_proj_qkvz.weight"] = w(2 * Hk * dk + 2 * Hv * dv, D) * 4
                t[q + "in_proj_ba.weight"] = w(2 * Hv, D) * 4
            else:
                t[q + "in_proj_qkv.weight"] = w(2 * Hk * dk + Hv * dv, D) * 4
                t[q + "in_proj_z.weight"] = w(Hv * dv, D) * 4
                t[q + "in_proj_b.weight"], t[q + "in_proj_a.weight"] = w(Hv, D) * 4, w(Hv, D) * 4
            t[q + "conv1d.weight"] = w(s.conv_dim, 1, s.conv_kernel) * 6
            t[q + "dt_bias"] = (1 + 0.3 * rng.standard_normal(Hv)).astype(np.float32)
            t[q + "A_log"] = np.log(rng.uniform(0.01, 16, Hv)).astype(np.float32)
            t[q + "norm.weight"] = (1 + zn(dv)).astype(np.float32)
            t[q + "out_proj.weight"] = w(D, Hv * dv) * 3
        else:
            q = p + "self_attn."
            t[q + "q_proj.weight"], t[q + "k_proj.weight"], t[q + "v_proj.weight"] = w(2 * H * hd, D), w(K * hd, D), w(K * hd, D)
            t[q + "o_proj.weight"], t[q + "q_norm.weight"], t[q + "k_norm.weight"] = w(D, H * hd), zn(hd), zn(hd)
        if not a.is_moe_layer(i):
            for n, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
                t[p + f"mlp.{n}.weight"] = w(*shape)
            continue
        E, Fe, Fs = a.num_experts, a.moe_intermediate_size, a.shared_expert_intermediate_size
        t[p + "mlp.gate.weight"] = w(E, D) * 4
        for j in range(E):
            for n, shape in (("gate_proj", (Fe, D)), ("up_proj", (Fe, D)), ("down_proj", (D, Fe))):
                t[p + f"mlp.experts.{j}.{n}.weight"] = w(*shape)
        for n, shape in (("gate_proj", (Fs, D)), ("up_proj", (Fs, D)), ("down_proj", (D, Fs))):
            t[p + f"mlp.shared_expert.{n}.weight"] = w(*shape)
        t[p + "mlp.shared_expert_gate.weight"] = w(1, D) * 4
    if n_mtp:
        t["mtp.fc.weight"] = w(D, 2 * D) * 2
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            t[f"mtp.{n}.weight"] = zn(D)
    return t


def make_hybrid_dir(root: Path, family: str, seed: int = 0, n_mtp: int = 0, edit=None, **overrides) -> tuple[Path, dict]:
    """A tiny HF folder (F32 safetensors) of ``family``; returns (dir, the weights)."""
    root.mkdir(parents=True, exist_ok=True)
    vocab = byte_level_tokenizer_json(root / "tokenizer.json")
    cfg = {**TINY_HYBRID[family], **overrides, "architectures": [ARCHS[family]], "model_type": family,
           "vocab_size": vocab}
    if n_mtp:
        cfg["mtp_num_hidden_layers"] = n_mtp
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    weights = hybrid_weights(cfg, vocab, np.random.default_rng(seed), n_mtp)
    if edit:
        edit(weights)
    write_safetensors(root / "model.safetensors", {k: ("F32", v) for k, v in weights.items()})
    return root, weights


# transformers' names in a decoder layer -> llama.cpp's (gguf-py tensor_mapping.py)
_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight", "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight", "linear_attn.in_proj_qkvz.weight": "ssm_in.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight", "linear_attn.out_proj.weight": "ssm_out.weight",
    "eh_proj.weight": "nextn.eh_proj.weight", "enorm.weight": "nextn.enorm.weight", "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
}


def _tiled(x: np.ndarray, axis: int, hk: int, r: int, width: int) -> np.ndarray:
    """Value heads from grouped (by key head) to tiled order along ``axis`` (conversion/qwen.py
    _reorder_v_heads: [G0_v0, G0_v1, G1_v0, G1_v1] -> [G0_v0, G1_v0, G0_v1, G1_v1])."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(hk, r, width, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def _convert(name: str, a: np.ndarray, cfg: dict, legacy: bool) -> list[tuple[str, np.ndarray]]:
    """One transformers tensor of layer-relative ``name`` -> llama.cpp's (name, array) pairs."""
    fam = cfg["model_type"]
    hk, hv, dk, dv = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim"))
    r = hv // hk
    if name.endswith("A_log"):
        a = -np.exp(a)
    elif name.endswith("conv1d.weight"):
        a = a.reshape(a.shape[0], -1)
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        a = np.float32(1.0) + a  # zero-centred norms are stored as 1 + w
    if fam != "qwen3_next" and r > 1 and name.startswith("linear_attn."):  # V heads to tiled order
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            a = np.concatenate([a[:2 * hk * dk], _tiled(a[2 * hk * dk:], 0, hk, r, dv)])
        elif name.endswith("in_proj_z.weight"):
            a = _tiled(a, 0, hk, r, dv)
        elif name.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
            a = _tiled(a, 0, hk, r, 1)
        elif name.endswith("out_proj.weight"):
            a = _tiled(a, 1, hk, r, dv)
    if name.endswith("in_proj_qkvz.weight") and not legacy:  # [q, k, v, z] per key head -> q | k | v, z
        g = a.reshape(hk, 2 * dk + 2 * r * dv, -1)
        q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
        D = a.shape[1]
        return [("attn_qkv.weight", np.concatenate([x.reshape(-1, D) for x in (q, k, v)])), ("attn_gate.weight", z.reshape(-1, D))]
    return [(_GGUF_LAYER[name], a)]


def write_hybrid_gguf(path: Path, hf_dir: Path, weights: dict[str, np.ndarray], legacy: bool = False) -> Path:
    """The checkpoint of ``make_hybrid_dir`` as llama.cpp's converter writes it (F32): every
    layer's tensors renamed and transformed (module docstring), experts stacked (E, out, in),
    the MTP head as layer N's nextn.* tensors.  ``legacy``: Qwen3-Next's in_proj_qkvz kept as
    the grouped ssm_in of older converters."""
    import re

    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    fam, arch = cfg["model_type"], GGUF_ARCH[cfg["model_type"]]
    L, n_mtp = cfg["num_hidden_layers"], cfg.get("mtp_num_hidden_layers", 0)
    rp = cfg.get("rope_parameters") or cfg
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name("tiny-" + fam)
    wr.add_block_count(L + n_mtp)
    if n_mtp:
        wr.add_nextn_predict_layers(n_mtp)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_key_length(cfg["head_dim"])
    wr.add_value_length(cfg["head_dim"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_rope_freq_base(rp["rope_theta"])
    wr.add_rope_dimension_count(int(cfg["head_dim"] * rp["partial_rotary_factor"]))
    wr.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    wr.add_ssm_state_size(cfg["linear_key_head_dim"])
    wr.add_ssm_group_count(cfg["linear_num_key_heads"])
    wr.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    wr.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    wr.add_full_attention_interval(cfg["full_attention_interval"])
    if "num_experts" in cfg:
        wr.add_expert_count(cfg["num_experts"])
        wr.add_expert_used_count(cfg["num_experts_per_tok"])
        wr.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        wr.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    vocab = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).get_vocab()
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list([t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])])
    wr.add_token_merges([])
    wr.add_eos_token_id(vocab["<|im_end|>"])

    mtp_names = {"mtp.fc.weight": "eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
                 "mtp.pre_fc_norm_hidden.weight": "hnorm.weight", "mtp.norm.weight": "shared_head.norm.weight"}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, a in weights.items():
        top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
        if name in top:
            wr.add_tensor(top[name], np.float32(1.0) + a if name == "model.norm.weight" else a)
            continue
        if name in mtp_names:  # _Qwen35MtpMixin: the head's own tensors as layer N's
            i, rest = L, mtp_names[name]
        else:
            m = re.match(r"^(?:model\.layers\.(\d+)|mtp\.layers\.(\d+))\.(.+)$", name)
            i, rest = (int(m.group(1)) if m.group(1) else L + int(m.group(2))), m.group(3)
        m = re.match(r"^mlp\.experts\.(\d+)\.(\w+)_proj\.weight$", rest)
        if m:
            experts.setdefault(f"blk.{i}.ffn_{m.group(2)}_exps.weight", {})[int(m.group(1))] = a
            continue
        for gname, data in _convert(rest, a, cfg, legacy):
            wr.add_tensor(f"blk.{i}.{gname}", np.ascontiguousarray(data, np.float32))
    for name, by_id in experts.items():
        wr.add_tensor(name, np.stack([by_id[j] for j in range(len(by_id))]))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
