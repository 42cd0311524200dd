"""Token-id prompts (GenerationRequest.prompt_ids) through the real engine over a checkpoint in
memory (engine.engine_for: what load tests serve a random-weight shape with): the ids go in as
they are, batched and solo alike; an id outside the vocabulary ends the request with an error."""
import numpy as np
import pytest

from bw24chat.api import DoneEvent, ErrorEvent, GenerationRequest, SamplingParams, TokenEvent
from bw24chat.engine import engine_for
from bw24chat.options import EngineOptions
from bw24chat.synthetic import synthetic_checkpoint


@pytest.fixture(scope="module")
def ckpt():
    return synthetic_checkpoint("tiny", "Q8_0")


def _run(engine, ids):
    """The final event and the generated ids, as the token events carry them."""
    evs = list(engine.submit(GenerationRequest(prompt_ids=ids, sampling=SamplingParams(temperature=0, max_tokens=6))).events())
    return evs[-1], [t for e in evs if isinstance(e, TokenEvent) for t in e.token_ids]


def test_prompt_ids_go_in_as_they_are(ckpt, rng):
    V = ckpt.config["vocab_size"]
    ids = [int(t) for t in rng.integers(0, V, 37)]
    outs = []
    for max_batch in (1, 0):  # solo, then the batched path
        engine = engine_for(ckpt, EngineOptions(device="cpu", max_batch=max_batch, n_ctx=256), aliases=(ckpt.name,))
        try:
            final, out = _run(engine, ids)
            assert isinstance(final, DoneEvent) and final.usage.prompt_tokens == 37 and len(out) == 6
            assert _run(engine, list(np.array(ids)))[1] == out  # NumPy integers are ids too
            bad, _ = _run(engine, ids[:5] + [V])
            assert isinstance(bad, ErrorEvent) and str(V) in bad.message
            assert isinstance(_run(engine, [True, 1])[0], ErrorEvent)  # a bool is not a token id
            assert engine.info.id == ckpt.name
            outs.append(out)
        finally:
            engine.close()
    assert outs[0] == outs[1]


def test_one_input_only():
    with pytest.raises(ValueError):
        GenerationRequest(prompt="x", prompt_ids=[1])
