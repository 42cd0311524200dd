"""The decode step with the hand-offs of integer-dot codes gives the same logits bit for bit as without
them, graph and eager, on random-weight models whose projections are on the integer-dot contract:
the attention's finishing blocks writing the o projection's QX codes (the default; the runner's
attn_qx off computes them in the o matvec's prologue), in both activation contracts."""
import numpy as np
import pytest


def _decode_logits(r, prompt) -> dict:
    """{graph: the logits of decoding prompt[32:] after a prefill of prompt[:32]}, graph and eager."""
    out = {}
    for graph in (True, False):
        r.use_graph = graph
        r.graphs.clear()
        r.plans.clear()  # attn_qx changes the plan
        r.prefill(prompt[:32], 0)
        out[graph] = np.stack([r.decode_logits(int(t), 32 + i) for i, t in enumerate(prompt[32:])])
    return out


def _assert_same_bits(a: dict, b: dict) -> None:
    for graph in (True, False):
        assert np.array_equal(a[graph].view(np.uint32), b[graph].view(np.uint32)), graph


@pytest.mark.parametrize("fmt", ["NVFP4", "Q8_0"])
@pytest.mark.parametrize("activations", ["f32", "bf16"])
def test_attention_qx_hand_off_gives_the_same_logits(cp, fmt, activations):
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny", fmt)
    prompt = np.random.default_rng(3).integers(0, 4096, 40)
    logits = {}
    for hand_off in (False, True):
        r = CudaRunner(ck, 1024, "bf16", activations=activations)
        r.attn_qx = hand_off
        logits[hand_off] = _decode_logits(r, prompt)
        assert any(k[0] == "d:qx_attn" for k in r._bufs) == hand_off  # the hand-off ran (or did not)
        del r
    _assert_same_bits(logits[False], logits[True])
