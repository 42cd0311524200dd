"""The NumPy sampler (the contract the device sampler reproduces)."""
import numpy as np

from bw24chat.api import SamplingParams
from bw24chat.sampling import apply_repeat_penalty, philox_uniform, sample_token


def test_greedy_is_first_argmax():
    l = np.array([0.1, 3.0, 3.0, -1], np.float32)
    assert sample_token(l, SamplingParams(temperature=0), 1, 0) == 1


def test_philox_matches_numpy_generator_definition():
    bg = np.random.Philox(key=[7, 0], counter=[11, 0, 0, 0])
    x = int(bg.random_raw())
    assert philox_uniform(7, 11) == (x >> 11) / 2**53
    assert 0.0 <= philox_uniform(2**70 + 3, 5) < 1.0


def test_same_seed_same_tokens_and_positions_differ():
    rng = np.random.default_rng()
    l = rng.standard_normal(1000).astype(np.float32)
    p = SamplingParams(temperature=1.0)
    a = [sample_token(l, p, 42, pos) for pos in range(50)]
    b = [sample_token(l, p, 42, pos) for pos in range(50)]
    assert a == b and len(set(a)) > 5


def test_top_k_one_is_greedy_and_top_p_min_p_restrict():
    rng = np.random.default_rng()
    l = rng.standard_normal(500).astype(np.float32) * 3
    best = int(np.argmax(l))
    for pos in range(20):
        assert sample_token(l, SamplingParams(temperature=1.5, top_k=1), 3, pos) == best
        assert sample_token(l, SamplingParams(temperature=1.0, top_p=1e-9), 3, pos) == best
        assert sample_token(l, SamplingParams(temperature=1.0, min_p=0.999), 3, pos) == best
    top5 = set(np.argsort(-l)[:5].tolist())
    assert {sample_token(l, SamplingParams(temperature=2.0, top_k=5), 9, pos) for pos in range(200)} <= top5


def test_distribution_follows_softmax():
    l = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    draws = np.bincount([sample_token(l, SamplingParams(temperature=1.0), 1234, pos) for pos in range(6000)], minlength=3) / 6000
    np.testing.assert_allclose(draws, [0.5, 0.3, 0.2], atol=0.03)


def test_repeat_penalty():
    l = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repeat_penalty(l, [0, 1, 1], 2.0, 64)
    np.testing.assert_array_equal(out, np.array([1.0, -4.0, 1.0], np.float32))
    assert sample_token(np.array([2.0, 1.9], np.float32), SamplingParams(temperature=0, repeat_penalty=1.5), 0, 0, [0]) == 1


def test_repeat_window_is_the_device_samplers():
    """repeat_last_n 0 penalizes nothing (llama.cpp's meaning, and what the device sampler's ring
    of 0 ids does), and a window is at most REPEAT_WINDOW_MAX ids (the ring's size), so the host
    and device samplers agree for every value the options accept."""
    import argparse

    import pytest

    from bw24chat.options import OptionError, add_engine_args, options_from_args
    from bw24chat.sampling import REPEAT_WINDOW_MAX

    logits = np.arange(1.0, 401.0, dtype=np.float32)
    hist = list(range(300))
    assert np.array_equal(apply_repeat_penalty(logits, hist, 2.0, 0), logits)
    capped = apply_repeat_penalty(logits, hist, 2.0, 10_000)
    assert np.array_equal(capped, apply_repeat_penalty(logits, hist, 2.0, REPEAT_WINDOW_MAX))
    assert np.count_nonzero(capped != logits) == REPEAT_WINDOW_MAX
    p = argparse.ArgumentParser()
    add_engine_args(p)
    with pytest.raises(OptionError, match="repeat-last-n"):
        options_from_args(p.parse_args(["--repeat-last-n", str(REPEAT_WINDOW_MAX + 1)]))


def test_device_params_image_holds_each_field():
    """cuda_ops.pack_sampling_params: the words sampling.cu reads (params[0..9]: float64 bits of
    temperature, top_p, min_p and the penalty; top_k, repeat_last_n, the seed's two halves, the
    ring fill, the push flag), negative counts as 0, the rest of the 16 words zero."""
    from bw24chat.backends import cuda_ops as ops

    p = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, repeat_last_n=300)
    seed = (12345 << 64) | 0xFEDCBA9876543210
    w = ops.pack_sampling_params(p, seed, 77, push=True)
    assert w.dtype == np.uint64 and w.shape == (ops.SAMPLE_PARAM_WORDS,) and w.flags.writeable
    f64 = w.view(np.float64)
    assert (f64[0], f64[2], f64[3], f64[4]) == (0.7, 0.95, 0.05, 1.1)
    assert w[1:2].tolist() + w[5:10].tolist() == [40, 300, 0xFEDCBA9876543210, 12345, 77, 1]
    assert not w[10:].any()
    w = ops.pack_sampling_params(SamplingParams(temperature=0, top_k=-1, repeat_last_n=-5), 3)
    assert w[[1, 5, 6, 7, 8, 9]].tolist() == [0, 0, 3, 0, 0, 0] and w.view(np.float64)[0] == 0.0


def test_device_rows_carry_the_repetition_window():
    """cuda_runner.sampling_rows: row i's ring is the last n ids of history + tokens[:i + 1], n =
    min(repeat_last_n, REPEAT_WINDOW_MAX, ids so far) with a penalty, else none; its params image
    says n (the ring fill)."""
    from bw24chat.backends.cuda_runner import sampling_rows
    from bw24chat.sampling import REPEAT_WINDOW_MAX

    rng = np.random.default_rng()
    for _ in range(50):
        hist = rng.integers(0, 1000, int(rng.integers(0, 2 * REPEAT_WINDOW_MAX)))
        hist = hist if rng.random() < 0.5 else hist.tolist()
        toks = rng.integers(0, 1000, int(rng.integers(1, 10))).tolist()
        p = SamplingParams(repeat_penalty=float(rng.choice([1.0, 1.1])),
                           repeat_last_n=int(rng.choice([0, 1, 64, REPEAT_WINDOW_MAX])))
        for i, (image, ring) in enumerate(sampling_rows(toks, p, 5, hist)):
            seen = [int(t) for t in hist] + toks[:i + 1]
            n = min(p.repeat_last_n, REPEAT_WINDOW_MAX, len(seen)) if p.repeat_penalty != 1.0 else 0
            assert ring == (seen[-n:] if n else []) and image[8] == n
