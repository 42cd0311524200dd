"""The decode step with the hand-off of integer-dot codes (the default; BW24CHAT_ATTN_QX=0 turns it
off: the attention's finishing blocks write the o projection's QX codes) gives the same logits bit for bit
as without them, in both activation contracts, graph and eager — on a random-weight model whose
o projection is on the integer-dot contract."""
import numpy as np
import pytest


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
        for graph in (True, False):
            r.use_graph, r.graph = graph, None
            r.prefill(prompt[:32], 0)
            logits[env, graph] = np.stack([r.decode_logits(int(t), 32 + i) for i, t in enumerate(prompt[32:])])
        del r
    for graph in (True, False):
        assert np.array_equal(logits["0", graph].view(np.uint32), logits["1", graph].view(np.uint32)), graph


@pytest.mark.parametrize("fmt", ["NVFP4", "Q4_K"])
def test_rotating_qx_warp_gives_the_same_logits(cp, monkeypatch, fmt):
    """matvec.cu QX_ROTATE (BW24CHAT_QX_ROTATE=1): the gate|up epilogue's quantizing warp rotating
    with the tile ordinal gives the decode step's logits bit for bit, graph and eager.  The tiny
    model's matrices take the wide geometry by the switches (16 warps x 4 rows: 64-row gate|up
    tiles, so QX) and grids of 2 blocks, so each block quantizes several tiles."""
    from bw24chat.backends.cuda_runner import CudaRunner
    from bw24chat.synthetic import synthetic_checkpoint

    ck = synthetic_checkpoint("tiny", fmt)
    prompt = np.random.default_rng(4).integers(0, 4096, 40)
    for k, v in (("BW24CHAT_MV_MAX_BLOCKS", "2"), ("BW24CHAT_MV_NW", "16"), ("BW24CHAT_MV_R", "4"), ("BW24CHAT_MV_STAT8", "1")):
        monkeypatch.setenv(k, v)
    logits = {}
    for env in ("0", "1"):
        monkeypatch.setenv("BW24CHAT_QX_ROTATE", env)
        r = CudaRunner(ck, 1024, "bf16")
        assert r._down_takes_qx(r.layers[0], 1), "the QX hand-off expected"
        for graph in (True, False):
            r.use_graph, r.graph = graph, None
            r.prefill(prompt[:32], 0)
            logits[env, graph] = np.stack([r.decode_logits(int(t), 32 + i) for i, t in enumerate(prompt[32:])])
        del r
    for graph in (True, False):
        assert np.array_equal(logits["0", graph].view(np.uint32), logits["1", graph].view(np.uint32)), graph
