"""The runner interface (backends/runner.py) on the NumPy backend: a step of m rows gives each
row the token (and logits) of a one-row step at its position, prefill samples the next token as
the first step would, and the generation loop drives it to the same tokens either way."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.synthetic import synthetic_checkpoint


@pytest.fixture(scope="module")
def ck():
    return synthetic_checkpoint("tiny", "Q8_0")


@pytest.mark.parametrize("params", [SamplingParams(temperature=0),
                                    SamplingParams(temperature=0.9, top_k=50, top_p=0.95, repeat_penalty=1.2)])
def test_step_rows_equal_single_steps(ck, params):
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, 4096, 37)]
    rows = [int(t) for t in rng.integers(0, 4096, 5)]
    a = numpy_runner(ck, 256)
    a.prefill(prompt, 0)
    got = a.step(rows, len(prompt), params, 7, prompt)
    got_logits = a.last_logits()
    b = numpy_runner(ck, 256)
    b.prefill(prompt, 0)
    want, want_logits = [], []
    for i, t in enumerate(rows):
        want += b.step([t], len(prompt) + i, params, 7, prompt + rows[:i])
        want_logits.append(b.last_logits()[0])
    assert got == want
    assert np.array_equal(got_logits.view(np.uint32), np.stack(want_logits).view(np.uint32))


def test_prefill_samples_what_a_step_would(ck):
    sp = SamplingParams(temperature=0.8, seed=3)
    prompt = list(range(10, 30))
    a = numpy_runner(ck, 256)
    first = a.prefill(prompt, 0, sp, 11)
    b = numpy_runner(ck, 256)
    b.prefill(prompt[:-1], 0)
    assert b.step(prompt[-1:], len(prompt) - 1, sp, 11, prompt[:-1]) == [first]
    # chunked prefill (history carries the earlier chunks) lands on the same token
    c = numpy_runner(ck, 256)
    c.prefill(prompt[:8], 0)
    assert c.prefill(prompt[8:], 8, sp, 11, prompt[:8]) == first
