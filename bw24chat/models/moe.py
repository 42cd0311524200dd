"""The sparse (mixture-of-experts) FFN any model file attaches to the dense block: a router
picks k of E SwiGLU experts per token, their outputs are summed with the router's weights, plus
the always-on shared experts where the family has them.  Attention is the dense block's
(dense.py).  Family files (qwen3_moe.py, glm4_moe.py, minimax_m2.py) choose the router rule
(ops.RouterSpec), which layers are sparse, and their attention switches.

Shape legend: T tokens, D model width, E routed experts, k experts per token, F expert width.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops import Loader, Ops, RouterSpec
from .dense import BaseArgs, DenseTransformer, Layer


@dataclass
class MoEArgs(BaseArgs):
    num_experts: int = 0
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 0
    scoring_func: str = "softmax"  # "softmax" | "sigmoid"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int | None = 1
    topk_group: int | None = 1
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # the shared expert's width where the family gives it (Qwen2-MoE, Qwen3-Next)

    def is_moe_layer(self, i: int) -> bool:
        return True

    def router_spec(self) -> RouterSpec:
        return RouterSpec(self.num_experts, self.num_experts_per_tok, self.scoring_func, bool(self.norm_topk_prob),
                          self.n_group or 1, self.topk_group or 1, float(self.routed_scaling_factor))


@dataclass
class MoE:
    router: object  # (E, D) gate, a linear
    experts: object  # Loader.load_experts
    bias: object = None  # (E,) selection bias (sigmoid routers)
    shared: tuple | None = None  # (gu, down, gate or None): ops.experts' shared expert


class MoETransformer(DenseTransformer):
    Args = MoEArgs

    def __init__(self, args: MoEArgs, loader: Loader, tensors: dict, n_ctx: int, progress=None):
        super().__init__(args, loader, tensors, n_ctx, progress)
        self.router = args.router_spec()

    @classmethod
    def ffn_shapes(cls, a: MoEArgs, i: int) -> dict[str, tuple[tuple[int, ...], bool]]:
        if not a.is_moe_layer(i):
            return super().ffn_shapes(a, i)
        D, E, Fe = a.hidden_size, a.num_experts, a.moe_intermediate_size or a.intermediate_size
        Fs = a.shared_expert_intermediate_size or Fe * max(a.n_shared_experts, 1)  # the shared experts, as one MLP
        return {"ffn_gate_inp": ((E, D), True), "ffn_gate_exps": ((E, Fe, D), True), "ffn_up_exps": ((E, Fe, D), True),
                "ffn_down_exps": ((E, D, Fe), True), "exp_probs_b": ((E,), False),
                "ffn_gate_shexp": ((Fs, D), False), "ffn_up_shexp": ((Fs, D), False), "ffn_down_shexp": ((D, Fs), False),
                "ffn_gate_inp_shexp": ((D,), False)}

    def load_ffn(self, L: Loader, i: int, t, has) -> dict:
        if not self.args.is_moe_layer(i):
            return super().load_ffn(L, i, t, has)
        shared = None
        if has("ffn_gate_shexp"):  # GLM-4.5's n_shared_experts are stored as one wider MLP
            shared = (L.load_linear([t("ffn_gate_shexp"), t("ffn_up_shexp")], interleave=True, role="shexp_gu"),
                      L.load_linear([t("ffn_down_shexp")], role="shexp_down"),
                      L.load_vector([t("ffn_gate_inp_shexp")]) if has("ffn_gate_inp_shexp") else None)
        return dict(moe=MoE(router=L.load_linear([t("ffn_gate_inp")], role="router"),
                            experts=L.load_experts(t("ffn_gate_exps"), t("ffn_up_exps"), t("ffn_down_exps")),
                            bias=L.load_vector([t("exp_probs_b")]) if has("exp_probs_b") else None,
                            shared=shared))

    def ffn(self, ops: Ops, li: int, L: Layer, x):
        if L.moe is None:
            return super().ffn(ops, li, L, x)
        h = ops.rmsnorm(x, L.ffn_norm)
        ids, w = ops.router(h, L.moe.router, self.router, L.moe.bias)
        return ops.experts(h, ids, w, L.moe.experts, residual=x, shared=L.moe.shared)
