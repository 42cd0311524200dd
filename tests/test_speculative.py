"""Speculative decoding (speculative.py, Generator.speculate) on the NumPy backend: the drafters
and the gate of ``bw24chat check --spec`` on the dense gate model and on a hybrid
one (gated DeltaNet + MTP head) (a reduced size here; the full tables are marked slow).
tests/gpu/test_speculative.py runs the same gate on CudaRunner; test_speculative_k.py tests the adaptive K."""
import argparse

import pytest

from bw24chat import check
from bw24chat.api import SamplingParams
from bw24chat.generate import Generator
from bw24chat.options import add_engine_args, options_from_args
from bw24chat.speculative import MAX_K, NgramDrafter, OracleDrafter, make_drafter


@pytest.fixture(scope="module")
def gate_model():
    runner, tok, _ = check.spec_runner("cpu")
    return runner, tok


@pytest.fixture(scope="module")
def hybrid_gate_model():
    """check.SPEC_HYBRID: gated DeltaNet layers (their recurrent state checkpointed per verify row)
    and an MTP head, so the gate runs the mtp drafter too."""
    runner, tok, _ = check.spec_runner("cpu", hybrid=True)
    assert runner.state is not None and runner.mtp is not None
    return runner, tok


# ----------------------------------------------------------------------------- drafters
def test_ngram_takes_the_longest_most_recent_match():
    d = NgramDrafter(max_n=3)
    d.begin([])
    #       0  1  2  3  4  5  6  7  8  9
    hist = [1, 2, 3, 9, 2, 3, 7, 5, 2, 3]
    # the suffix 3-gram (5, 2, 3) never occurred; the 2-gram (2, 3) last occurred at 4..5 -> 7, 5, 2
    assert d.propose(hist, 3) == [7, 5, 2]
    hist += [4, 1, 2, 3]  # now (1, 2, 3) occurred at 0..2, followed by 9
    assert d.propose(hist, 2) == [9, 2]
    assert NgramDrafter().propose([8], 4) == [] and NgramDrafter().propose([1, 6, 7], 1) == []  # no match
    assert NgramDrafter().propose([1, 6, 6], 2) == [6, 6]  # (6,) was followed by 6


def test_ngram_confidence_is_the_matched_length():
    """The class DraftLength estimates acceptance by: the length of the suffix match propose uses."""
    d = NgramDrafter(max_n=3)
    d.begin([])
    hist = [1, 2, 3, 9, 2, 3, 7, 5, 2, 3]
    assert d.confidence(hist) == 2 and d.propose(hist, 3) == [7, 5, 2]
    assert d.confidence(hist + [4, 1, 2, 3]) == 3 and d.propose(hist + [4, 1, 2, 3], 2) == [9, 2]
    assert d.confidence(hist + [4, 1, 2, 3, 8]) == 0 and d.propose(hist + [4, 1, 2, 3, 8], 2) == []
    assert d.confidence(hist + [4, 1, 2, 3, 8, 7]) == 1 and d.propose(hist + [4, 1, 2, 3, 8, 7], 1) == [5]


def test_ngram_continues_a_repeating_pattern_past_the_end():
    d = NgramDrafter()
    d.begin([])
    assert d.propose([5, 6, 7, 5, 6, 7, 5], 7) == [6, 7, 5, 6, 7, 5, 6]


def test_ngram_index_grows_incrementally_and_matches_a_rescan():
    import random

    rng = random.Random(3)
    hist = [rng.randrange(6) for _ in range(300)]
    inc = NgramDrafter()
    inc.begin(hist[:20])
    for n in range(20, len(hist)):
        fresh = NgramDrafter()
        fresh.begin([])
        assert inc.propose(hist[:n], 5) == fresh.propose(hist[:n], 5)


def test_oracle_proposes_the_truth_with_errors():
    d = OracleDrafter([10, 11, 12, 13, 14], errors={2}, vocab=100)
    d.begin([1, 2])
    assert d.propose([1, 2, 10], 3) == [11, 13, 13]  # output index 2 is wrong: 12 + 1
    assert d.propose([1, 2, 10, 11, 12, 13, 14], 3) == []


# ----------------------------------------------------------------------------- the generator
def test_logprobs_and_stats_with_speculation(gate_model):
    """The logprob of each token of an accepted run comes from its own row of the verify step."""
    runner, tok = gate_model
    prompt = check.spec_cases(runner.vocab_size, runner.n_ctx, 40)[1].prompt  # repeating: drafts get accepted
    sp = SamplingParams(temperature=0, max_tokens=40)
    plain = Generator(runner, tok).generate(prompt, sp, logprobs=3)
    lps_plain, lps_spec = [], []
    spec = Generator(runner, tok).generate(prompt, sp, lambda t, ids, lp: lps_spec.extend(lp or []), logprobs=3,
                                           drafter=NgramDrafter(), spec_k=4)
    Generator(runner, tok).generate(prompt, sp, lambda t, ids, lp: lps_plain.extend(lp or []), logprobs=3)
    assert spec.token_ids == plain.token_ids
    assert [(x.token_id, x.logprob, x.top) for x in lps_spec] == [(x.token_id, x.logprob, x.top) for x in lps_plain]
    st = spec.stats
    assert st["spec_accepted"] > 0 and st["spec_rounds"] > 0 and st["spec_drafted"] <= 4 * st["spec_rounds"]
    assert st["spec_mean_len"] == pytest.approx(1 + st["spec_accepted"] / st["spec_rounds"])
    assert plain.stats == {}


# ----------------------------------------------------------------------------- the gate
def test_gate_reduced(gate_model):
    runner, tok = gate_model
    results = check.spec_gates(runner, tok, ks=(1, 0, MAX_K), n_gen=32)  # 0: auto
    assert len(results) == 3 * 2 * 3  # K x sampling x drafter (n-gram, oracle, MTP head)
    bad = [f"{r.name}: {r.value}" for r in results if not r.ok]
    assert not bad, bad


@pytest.mark.slow
def test_gate_full(gate_model):
    runner, tok = gate_model
    results = check.spec_gates(runner, tok) + [check.spec_fixed_gate(runner, tok)]
    assert len(results) == (MAX_K + 1) * 2 * 3 + 1
    bad = [f"{r.name}: {r.value}" for r in results if not r.ok]
    assert not bad, bad


def test_gate_hybrid_reduced(hybrid_gate_model):
    runner, tok = hybrid_gate_model
    results = check.spec_gates(runner, tok, ks=(1, MAX_K), n_gen=32, label="spec/hybrid")
    assert len(results) == 2 * 2 * 3  # K x sampling x (ngram, oracle, mtp)
    bad = [f"{r.name}: {r.value}" for r in results if not r.ok]
    assert not bad, bad


@pytest.mark.slow
def test_gate_hybrid_full(hybrid_gate_model):
    runner, tok = hybrid_gate_model
    results = check.spec_gates(runner, tok, label="spec/hybrid") + [check.spec_fixed_gate(runner, tok, "spec/hybrid")]
    assert len(results) == (MAX_K + 1) * 2 * 3 + 1
    bad = [f"{r.name}: {r.value}" for r in results if not r.ok]
    assert not bad, bad


def test_fixed_configuration(gate_model):
    """Oracle drafter, K = 4, greedy, the gate's first prompt, 128 tokens.

    The counts follow from check.ORACLE_ERRORS alone (check.oracle_log works them out): the
    prefill gives token 0; a round at c (tokens out) proposes truth[c:c + 4], accepts the drafts
    before the first error and adds the true token as the bonus, so c grows by accepted + 1.
    The rounds start at c = 1, 3, 8, 9, 14, 16, 21, ...: errors 2, 8, 15, 36..43 (eight rounds
    that accept nothing), 60, 61 and 90 cut rounds short, while 7, 100 and 127 fall on bonus
    positions (of the rounds at c = 3, 96 and 126) and so are never proposed.  The 127 tokens
    after the prefill's are 36 rounds + 91 accepted drafts; drafted = 35 x 4 + 1 (the last
    round, at c = 126, is capped to one draft by max_tokens).

    The sha256 is that of plain greedy decoding's 128 tokens (int32 little-endian) on the NumPy
    backend for check.SPEC_SHAPE's random weights (synthetic seed 0, Q8_0): the speculative run
    must give the same; it changes only if the model, its weights or the NumPy numerics change."""
    runner, tok = gate_model
    counts, got, plain = check.spec_fixed(runner, tok)
    assert counts == (36, 141, 91)
    assert got == plain == "ccc52e3cf94ab65f51ba83e0571462c89c432be03a01c0919575bb95a1e7489e"


def test_check_spec_cli(capsys):
    assert check.main(["--spec", "--device", "cpu", "--spec-k", "2,auto"]) == 0
    out = capsys.readouterr().out
    assert "check --spec on NumPy" in out and "ngram  sampled K=2" in out and "oracle greedy  K=auto" in out
    assert "0 failed" in out
    assert "spec/hybrid" in out and "mtp    greedy  K=2" in out


# ----------------------------------------------------------------------------- options
def _parse(*argv):
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return options_from_args(p.parse_args(list(argv)))


def test_spec_flags(capsys):
    o = _parse("--spec", "ngram", "--spec-k", "3")
    assert (o.spec, o.spec_k) == ("ngram", 3)
    o = _parse("--spec", "ngram")
    assert (o.spec, o.spec_k) == ("ngram", 0)  # auto
    assert _parse().spec == "off" and make_drafter("off") is None
    assert _parse("--spec", "mtp").spec == "mtp"  # accepted here; refused at load without a head
    with pytest.raises(SystemExit):
        _parse("--spec-k", str(MAX_K + 1))
    assert "or auto" in capsys.readouterr().err
    with pytest.raises(ValueError, match="multi-token-prediction head"):
        make_drafter("mtp")


# ----------------------------------------------------------------------------- where users see it
def test_counters_in_usage_and_metrics():
    from bw24chat.api import DoneEvent, ModelInfo, Usage
    from bw24chat.server.metrics import Metrics
    from bw24chat.server.protocol import usage_body

    stats = {"spec_rounds": 10, "spec_drafted": 30, "spec_accepted": 21, "spec_acceptance": 0.7, "spec_mean_len": 3.1}
    done = DoneEvent("length", Usage(5, 41), stats)
    assert usage_body([done])["completion_tokens_details"] == {"accepted_prediction_tokens": 21, "rejected_prediction_tokens": 9}
    assert "completion_tokens_details" not in usage_body([DoneEvent("length", Usage(5, 41), {})])
    m = Metrics()
    m.observe(done, 1.0)
    m.observe(done, 1.0)
    text = m.render(ModelInfo("m", "", "llama", 1, 8, "numpy", "CPU"), "m", 0, {})
    assert "bw24chat_spec_accepted_total 42" in text and "bw24chat_spec_drafted_total 60" in text
    assert "bw24chat_spec_acceptance_ratio 0.7" in text and "bw24chat_spec_tokens_per_step 3.1" in text


def test_engine_request_with_speculation_on_smollm2(smollm2_engine):
    """The real model on the editing workload (bench --spec): the same text, the counters in the
    stats, drafts accepted (the reply copies the paragraph)."""
    from bw24chat.api import GenerationRequest
    from bw24chat.bench import edit_messages

    msgs = edit_messages()
    sp = SamplingParams(temperature=0, max_tokens=48)
    text, plain = smollm2_engine.submit(GenerationRequest(messages=msgs, sampling=sp)).result()
    text2, spec = smollm2_engine.submit(GenerationRequest(messages=msgs, sampling=sp, spec="ngram", spec_k=0)).result()
    assert text2 == text and spec.text == plain.text and "spec_rounds" not in plain.stats
    assert spec.stats["spec_accepted"] > 0 and spec.stats["spec_mean_len"] > 1.5


def test_bench_oracle_accepts_at_the_rate_asked():
    """bench --spec oracle: each draft is right with probability --accept, independently, so a
    round of K drafts yields 1 + p + ... + p^K tokens on average; the output is plain decoding's."""
    from bw24chat import bench

    errs = bench.oracle_errors(20000, 0.8)
    assert abs(len(errs) / 20000 - 0.2) < 0.01 and errs == bench.oracle_errors(20000, 0.8)
    assert bench.oracle_errors(50, 1.0) == set() and bench.oracle_errors(50, 0.0) == set(range(50))
    with pytest.raises(ValueError, match="probability"):
        bench.oracle_errors(5, 1.5)
    a = bench.build_parser().parse_args(["--spec", "oracle", "--synthetic", "tiny", "--device", "cpu", "--spec-k", "4",
                                         "--runs", "1", "--max-tokens", "200"])
    run, _, _ = bench._synthetic_run(a)
    rows = bench.bench_spec(run, "oracle", [4], 1)
    assert all(r["identical"] for r in rows)
    want = 1 + sum(0.8 ** i for i in range(1, 5))  # 3.36
    assert abs(rows[1]["mean_len"] - want) < 0.5, rows[1]
    assert bench.main(["--spec", "oracle", "-m", "default"]) == 2  # the oracle needs a synthetic model
