"""The server on the real NumPy engine (SmolLM2-135M-Instruct Q4_1): concurrent clients each
get exactly what they get alone."""
from __future__ import annotations

import pytest
from .serverproc import run_concurrently, stream_chat

PROMPTS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "Count from one to five.",
    "Say hello in Spanish.",
    "What is 2 + 2?",
    "Write a haiku about rain.",
    "What is the opposite of hot?",
    "Name a planet in the solar system.",
    "What do bees make?",
    "Give me a synonym for happy.",
    "What language is spoken in Brazil?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "What is the boiling point of water?",
    "Tell me a fun fact about cats.",
    "What colour is the sky on a clear day?",
]


@pytest.fixture(scope="module")
def real_server(request, start_server):
    try:
        model_path = request.getfixturevalue("smollm2_path")
    except pytest.FixtureLookupError:
        pytest.skip("the smollm2_path fixture (tests/conftest.py) is not available")
    pytest.importorskip("bw24chat.engine")
    return start_server("-m", str(model_path), "--device", "cpu", "--max-queue", "32", ready_timeout=600)


@pytest.mark.slow
def test_concurrent_greedy_streams_match_solo_runs(real_server):
    client = real_server.client(timeout=600)
    greedy = dict(temperature=0, max_tokens=8, model="default")
    alone = [stream_chat(client, p, **greedy) for p in PROMPTS]
    assert all(alone), alone

    together = run_concurrently(lambda p: stream_chat(client, p, **greedy), PROMPTS, timeout=900)
    assert together == alone


@pytest.mark.slow
def test_real_engine_usage_and_seed(real_server):
    client = real_server.client(timeout=600)
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct.Q4_1"]  # the file stem, not general.name
    kw = dict(model="default", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=8)
    a = client.chat.completions.create(temperature=0.9, seed=1234, **kw)
    b = client.chat.completions.create(temperature=0.9, seed=1234, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert 1 <= a.usage.completion_tokens <= 8
    assert a.usage.prompt_tokens >= 5  # at least the words of the message
    assert a.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_token_array_prompts(real_server, smollm2):
    """A completion's prompt as token ids gives the reply of the same text as a string prompt;
    an id past the vocabulary is a 400 naming it."""
    import openai

    client = real_server.client(timeout=600)
    text = "The capital of France is"
    ids = smollm2.tokenizer.encode(text)
    kw = dict(model="default", max_tokens=6, temperature=0)
    by_text, by_ids = client.completions.create(prompt=text, **kw), client.completions.create(prompt=ids, **kw)
    assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt=[1, 49152], **kw)
    assert "49152" in str(e.value) and "0 to 49151" in str(e.value)
