"""The decode step with the hand-offs of integer-dot codes gives the same logits bit for bit as without
them, graph and eager, on random-weight models whose projections are on the integer-dot contract:
the attention's finishing blocks writing the o projection's QX codes (the default;
BW24CHAT_ATTN_QX=0 turns it off), in both activation contracts."""
import numpy as np
import pytest


def _decode_logits(r, prompt) -> dict:
    """{graph: the logits of decoding prompt[32:] after a prefill of prompt[:32]}, graph and eager."""
    out = {}
    for graph in (True, False):
        r.use_graph, r.graph = graph, None
        r.prefill(prompt[:32], 0)
        out[graph] = np.stack([r.decode_logits(int(t), 32 + i) for i, t in enumerate(prompt[32:])])
    return out


def _assert_same_bits(a: dict, b: dict) -> None:
    for graph in (True, False):
        assert np.array_equal(a[graph].view(np.uint32), b[graph].view(np.uint32)), graph


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0"])
@pytest.mark.parametrize("activations", ["f32", "bf16"])
def test_attention_qx_hand_off_gives_the_same_logits(cp, monkeypatch, fmt, activations):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny", fmt)
    prompt = np.random.default_rng(3).integers(0, 4096, 40)
    logits = {}
    for env in ("0", "1"):
        monkeypatch.setenv("BW24CHAT_ATTN_QX", env)
        r = CudaRunner(ck, 1024, "bf16", activations=activations)
        assert r._o_takes_qx(r.layers[0], 1) == (env == "1")
        logits[env] = _decode_logits(r, prompt)
        del r
    _assert_same_bits(logits["0"], logits["1"])
