"""The NextN / multi-token-prediction (MTP) head of DeepSeek-V3 (arXiv:2412.19437 §2.2) and
GLM-4.5, as a component any model file's trunk can carry: written once as op calls.

Row at position t takes the embedding of token t+1 and a hidden state h_t and predicts token t+2:

    x   = eh_proj(concat(enorm(emb(t+1)), hnorm(h_t)))          # (T, 2D) -> (T, D)
    g   = block(x)             one decoder layer of the trunk's own architecture (layer N =
                               num_hidden_layers: dense or MoE as the family says), its own KV cache
    out = head(shared_head_norm(g))                                # logits (T, V)

A trained head may draft over a reduced vocabulary (FR-Spec, Zhao et al. 2025, "Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling"): ``head`` is then the
trunk's LM head rows of the n most frequent tokens only and ``ops.vocab_expand`` puts its n logits
back at their ids (-inf elsewhere), so the draft is drawn by the same sampler; the verify runs the
trunk's full head, which keeps the output exact.

Followed: vLLM ``model_executor/models/deepseek_mtp.py`` (and glm4_moe_mtp.py, the same layer):
the concat order is [embedding, hidden]; the chained hidden state is g (the block's output,
before shared_head.norm).  h_t from the trunk is the trunk's *final-normed* output there (vLLM's
DeepseekV2Model.forward returns ``self.norm(hidden_states, residual)`` and that is what the
proposer passes); the runner hands the pre-norm rows (runner.last_hidden), so for trunk rows
this head applies the trunk's final norm first (``from_trunk``); chained rows take g as is.
Not followed: vLLM zeroes the embedding of the row at position 0 ("not needed by MTP"); here
that row is computed like any other (it only enters later rows through the head's KV cache).

The DeepSeek-V3 paper writes the concat as [h; emb]; the checkpoints' eh_proj is laid out for
[emb, h] (vLLM, SGLang deepseek_nextn.py), which is what the weights were trained with.

Qwen3-Next / Qwen3.5 carry the same head under other names (mtp.fc = eh_proj, pre_fc_norm_embedding
= enorm, pre_fc_norm_hidden = hnorm, mtp.norm = shared_head_norm; loaders/names.py), with the
trunk's embedding and LM head, a full-attention layer as the block, and one difference: the
chained hidden state is the *normed* output shared_head_norm(g) (vLLM qwen3_next_mtp.py returns
self.norm(hidden_states, residual) from the predictor, and the proposer feeds that back), which a
model file says with ``mtp_chains_normed``.
"""
from __future__ import annotations

from ..ops import Loader, Ops


def nextn_shapes(model_cls, a, n_layers: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """The tensors of the ``n_layers`` NextN layers after the trunk (canonical names: names.py)."""
    D, V = a.hidden_size, a.vocab_size
    out = {}
    for i in range(a.num_hidden_layers, a.num_hidden_layers + n_layers):
        p = f"blk.{i}.nextn."
        out.update(model_cls.layer_shapes(a, i))
        out.update({p + "eh_proj": ((D, 2 * D), True), p + "enorm": ((D,), True), p + "hnorm": ((D,), True),
                    p + "shared_head_norm": ((D,), True), p + "shared_head_head": ((V, D), False),
                    p + "embed_tokens": ((V, D), False)})
    return out


class MTPHead:
    """The first NextN layer of a checkpoint (GLM-4.5 and DeepSeek-V3 ship one; a checkpoint with
    more has them checked and loaded by the loaders, and this head chains the first one, as vLLM
    does with num_speculative_tokens > num_nextn_predict_layers)."""

    def __init__(self, model, loader: Loader, tensors: dict):
        self.model = model
        L, n = loader, model.args.num_hidden_layers
        t = lambda name: tensors[f"blk.{n}.nextn.{name}"]  # noqa: E731
        self.layer_index = n  # the family's rules for layer N (dense or MoE) apply to its block
        self.layer = model.load_layer(L, n, tensors)
        self.eh_proj = L.load_linear([t("eh_proj")], role="mtp_eh_proj")
        self.enorm = L.load_vector([t("enorm")])
        self.hnorm = L.load_vector([t("hnorm")])
        self.norm = L.load_vector([t("shared_head_norm")])
        # the checkpoint's own copies where it ships them (GLM-4.5 ships shared_head.head), else the
        # trunk's (DeepSeek-V3 §2.2: embedding and output head shared with the main model)
        has = lambda name: f"blk.{n}.nextn.{name}" in tensors  # noqa: E731
        self.embd = L.load_embedding(t("embed_tokens")) if has("embed_tokens") else model.tok_embd
        self.head = L.load_linear([t("shared_head_head")], role="mtp_head") if has("shared_head_head") else model.output
        # a reduced draft vocabulary (a trained head's draft_vocab; loaders/draft_head.py gathers the
        # trunk's LM head rows of those ids as shared_head_head): FR-Spec, Zhao et al. 2025
        self.vocab_map = (L.load_vocab_map(t("draft_vocab").raw, model.args.vocab_size) if has("draft_vocab")
                          else None)

    def forward(self, ops: Ops, ids, hidden, from_trunk: bool):
        """(logits of the rows the Ops object keeps, g (T, D)) of rows pairing ``ids`` (token t+1)
        with ``hidden`` (h_t, the same row), at positions t = ops' rows; ``from_trunk``: hidden
        is the trunk's pre-norm output (runner.last_hidden), else this head's own g (normed where
        the model says ``mtp_chains_normed``).  Writes the head's KV cache (layer 0 of the cache
        ``ops`` is bound to)."""
        m = self.model
        h = ops.rmsnorm(hidden, m.output_norm) if from_trunk else hidden
        x = ops.linear(ops.concat(ops.rmsnorm(ops.embed(self.embd, ids), self.enorm), ops.rmsnorm(h, self.hnorm)),
                       self.eh_proj)
        g = m.block(ops, 0, self.layer, x)
        normed = ops.rmsnorm(g, self.norm)
        logits = ops.lm_head(normed, self.head)
        if self.vocab_map is not None and logits is not None:
            logits = ops.vocab_expand(logits, self.vocab_map)
        return logits, (normed if m.mtp_chains_normed else g)


def load_mtp(model, loader: Loader, mtp_tensors: dict) -> MTPHead | None:
    """The model's MTP head from ``Checkpoint.mtp`` (None when the checkpoint has none)."""
    return MTPHead(model, loader, mtp_tensors) if mtp_tensors else None
