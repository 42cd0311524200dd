"""The integer-dot contract's activation quantization must not amplify rounding: prefill and
decode reach each quantizer with inputs that differ at rounding level (different reduction
orders, split-bf16 attention), and the prefill-vs-decode gate compares their argmax.  Here the
NumPy model of the contract is run twice on a random tiny model, once with the attention output
perturbed by 1e-5 relative (the precise prefill attention's error): the logits must stay close
and no argmax may change outside near-ties.  (One int8 level failed this: 2-4 changes in 64
positions; docs/performance.md.)"""
import numpy as np
import pytest

from bw24chat.backends.numpy_backend import NumpyBackend, NumpyOps, numpy_runner
from bw24chat.synthetic import synthetic_checkpoint


class PerturbedAttention(NumpyBackend):
    def __init__(self, eps: float, **kw):
        super().__init__(**kw)
        self.eps, self.rng = eps, np.random.default_rng(5)

    def pass_ops(self, *a, **k):
        backend = self

        class Ops(NumpyOps):
            def attention(self, *a, **k):
                o = super().attention(*a, **k)
                return (o * (1 + backend.eps * backend.rng.standard_normal(o.shape))).astype(np.float32)

        return Ops(self, *a, **k)


@pytest.mark.parametrize("fmt", ["Q8_0", "NVFP4", "Q6_K"])
def test_rounding_level_input_differences_do_not_flip_tokens(monkeypatch, fmt):
    monkeypatch.setenv("BW24CHAT_A8", "all")
    ck = synthetic_checkpoint("tiny", fmt)
    prompt = np.random.default_rng(1).integers(0, 4096, 96)
    ref = numpy_runner(ck, backend=NumpyBackend(act_quant=True)).prefill_logits(prompt, 0)
    got = numpy_runner(ck, backend=PerturbedAttention(1e-5, act_quant=True)).prefill_logits(prompt, 0)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    top2 = np.sort(ref, axis=1)[:, -2:]
    near = top2[:, 1] - top2[:, 0] < 1e-3
    flips = int(((got.argmax(1) != ref.argmax(1)) & ~near).sum())
    assert rel < 1e-3 and flips == 0, (rel, flips)
