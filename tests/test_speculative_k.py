"""The adaptive draft length (``--spec-k auto``, speculative.DraftLength) and the step-cost table
it reads (speculative.StepCosts): pure unit tests, and the generation loop and the batched
scheduler on the NumPy backend under a fake clock (each step advances it by a chosen cost of its
rows), so the K they choose is reproducible."""
from types import SimpleNamespace

import pytest

from bw24chat import check, generate, scheduler
from bw24chat.api import SamplingParams
from bw24chat.generate import Generator, Output
from bw24chat.speculative import MAX_K, DraftLength, NgramDrafter, OracleDrafter, StepCosts, prior_cost

# a step of m rows relative to one row (index m - 1): SmolLM2-135M on an H100 (launch-bound: the
# rows are nearly free up to a few, then the step grows), and a flat BF16-like 1 + 0.1 (m - 1)
SMOL = [1.0, 1.25, 1.6, 2.0, 2.3, 2.7, 3.2, 4.0, 5.3]
FLAT = [1 + 0.1 * (m - 1) for m in range(1, MAX_K + 2)]


def _timed(costs: list[float], ms: float = 1.0) -> StepCosts:
    """A table that has timed every row count 1..MAX_K + 1 (twice: the first timing is dropped)."""
    t = StepCosts()
    for _ in range(2):
        for m, c in enumerate(costs, 1):
            t.observe(m, c * ms * 1e-3)
    return t


def _at(costs: StepCosts, *rounds: tuple[int, int], n: int = 60) -> DraftLength:
    """A DraftLength after ``n`` rounds of (drafted, accepted), ``rounds`` repeated."""
    d = DraftLength(0, costs)
    for i in range(n):
        d.update(*rounds[i % len(rounds)])
    return d


# ----------------------------------------------------------------------------- the acceptance estimate
def test_acceptance_counts_the_drafts_that_were_tried():
    """Accepted drafts are a prefix: a round that kept 2 of 4 tried 3 (2 right, the third wrong,
    the fourth never judged), so its rate is 2/3, not accepted/drafted = 1/2; a round that kept
    all it drafted (fewer than K: the drafter ran short) saw no failure."""
    d = DraftLength(0)
    hits, trials = d.hits, d.trials
    assert hits / trials == pytest.approx(0.7)  # the prior
    d.update(4, 2)
    hits, trials = 0.9 * hits + 2, 0.9 * trials + 3
    assert (d.hits, d.trials) == pytest.approx((hits, trials))
    d.update(2, 2)
    hits, trials = 0.9 * hits + 2, 0.9 * trials + 2
    assert (d.hits, d.trials) == pytest.approx((hits, trials))
    assert _at(StepCosts(), (4, 2)).acceptance == pytest.approx(2 / 3, abs=0.01)
    assert _at(StepCosts(), (8, 0)).acceptance == pytest.approx(0.0, abs=0.01)
    assert _at(StepCosts(), (5, 5)).acceptance == pytest.approx(1.0, abs=1e-3)
    assert DraftLength(0).expected(3) == pytest.approx(1 + 0.7 + 0.7 ** 2 + 0.7 ** 3)


def test_fixed_k_never_moves():
    d = DraftLength(3, _timed(SMOL))
    for drafted, accepted in ((3, 0), (3, 3), (1, 1)):
        d.update(drafted, accepted)
        assert d.choose() == 3 and d.k == 3


# ----------------------------------------------------------------------------- the step-cost table
def test_step_costs_median_of_recent_timings_first_dropped():
    t = StepCosts()
    assert t.time(1) == 1.0 and t.time(5) == prior_cost(5) > 1  # nothing timed: the prior, in one-row steps
    t.observe(3, 9.0)  # the first step at 3 rows (a CUDA graph's capture): dropped
    assert not t.timed(3) and t.time(3) == prior_cost(3)
    for s in (2.0, 2.2, 50.0, 2.1):  # an outlier (a pause) does not move the median
        t.observe(3, s)
    assert t.timed(3) and t.time(3) == pytest.approx(2.15)
    for s in [1.0] * 20:  # only the recent timings count
        t.observe(3, s)
    assert t.time(3) == 1.0


def test_step_costs_fill_the_untimed_row_counts():
    t = StepCosts()
    for m, s in ((2, 1.0), (6, 3.0)):
        t.observe(m, s)
        t.observe(m, s)
    assert t.time(4) == pytest.approx(2.0)  # between two timed counts: linear
    assert t.time(9) == pytest.approx(4.5)  # above: on their line
    assert t.time(1) == pytest.approx(1.0 * prior_cost(1) / prior_cost(2))  # below: the prior's shape
    t.observe(8, 2.5)
    t.observe(8, 2.5)
    assert t.time(9) == pytest.approx(3.0)  # a line that would fall (noise): flat at the larger time
    one = StepCosts()
    one.observe(3, 2.0)
    one.observe(3, 2.0)
    assert one.time(5) == pytest.approx(2.0 * prior_cost(5) / prior_cost(3))  # one timed count: the prior's shape


# ----------------------------------------------------------------------------- the policy
def test_k_follows_the_cost_of_rows():
    """SmolLM2's steep costs: two drafts at a per-draft acceptance of 0.75-0.83 (its editing run,
    59 % of drafts accepted at K near 6 with 4.36 tokens a round, is about 0.83: each further
    draft adds less than its row costs); one draft at 0.6.  Flat BF16-like costs at 0.8: six."""
    smol, flat = _timed(SMOL), _timed(FLAT)
    assert _at(smol, (8, 3)).choose() == 2  # a = 3/4
    assert _at(smol, (8, 4)).choose() == 2  # 4/5
    assert _at(smol, (6, 5)).choose() == 2  # 5/6
    assert _at(smol, (8, 3)).expected(2) == pytest.approx(1 + 0.75 + 0.75 ** 2, abs=0.01)
    assert _at(smol, (4, 1), (4, 2)).acceptance == pytest.approx(0.6, abs=0.02)
    assert _at(smol, (4, 1), (4, 2)).choose() == 1  # 3/5
    assert _at(flat, (8, 4)).choose() == 6
    assert _at(flat, (8, 0)).choose() == 1
    assert _at(flat, (8, 8)).choose() == MAX_K  # everything accepted, rows cheap
    assert _at(_timed(FLAT, ms=40.0), (8, 4)).choose() == 6  # only the costs' shape matters


def test_acceptance_is_kept_per_class_of_drafts():
    """Drafts of different confidence (an n-gram drafter's match length) keep their own acceptance:
    on SmolLM2's costs, after rounds where single-token matches always failed and 4-gram matches
    always held, a round after a 1-gram match drafts one token and one after a 4-gram match as
    many as an always-right drafter would (five: the sixth row costs more than its token); a class
    never seen starts from the prior."""
    d = DraftLength(0, _timed(SMOL))
    for _ in range(30):
        d.use(1)
        d.update(4, 0)
        d.use(4)
        d.update(4, 4)
    d.use(1)
    assert d.acceptance == pytest.approx(0.0, abs=0.05) and d.choose() == 1
    d.use(4)
    assert d.acceptance == pytest.approx(1.0, abs=1e-3) and d.choose() == _at(_timed(SMOL), (8, 8)).choose() == 5
    d.use(2)
    assert d.acceptance == pytest.approx(0.7)
    assert d.choose() == _at(_timed(SMOL), (1, 1), n=0).choose()  # the prior's K


def test_k_in_a_batched_step_weighs_the_rows_beside_it():
    """Beside 30 rows that give 30 tokens in a step, extra rows are weighed against the whole
    step's time: with costs 1 + 0.1 (m - 1), K = 6 alone, fewer beside them."""
    t = StepCosts()
    for m in range(1, 64):
        t.observe(m, 1 + 0.1 * (m - 1))
        t.observe(m, 1 + 0.1 * (m - 1))
    d = _at(t, (8, 4))
    assert d.choose() == 6
    assert d.choose(rows=30, tokens=30.0) < 6
    assert d.choose(rows=30, tokens=0.0) == MAX_K  # rows that give no token (a prefill chunk): drafts ride along


def _simulate(costs: list[float], period: int, rounds: int = 48) -> list[int]:
    """Rounds whose draft outcomes are a fixed stream with every ``period``-th draft wrong (a
    per-draft acceptance of 1 - 1/period), each round timed at costs[K] ms."""
    t, ks, trial = StepCosts(), [], 0
    d = DraftLength(0, t)
    for _ in range(rounds):
        k = d.choose()
        ks.append(k)
        accepted = 0
        while accepted < k and (trial + 1) % period:
            accepted, trial = accepted + 1, trial + 1
        trial += accepted < k
        t.observe(k + 1, costs[k] * 1e-3)
        d.update(k, accepted)
    return ks


def test_k_converges_from_the_prior_in_a_few_rounds():
    """From no timings at all: SmolLM2's costs and acceptance 3/4 settle on K = 2, flat costs and
    4/5 on K = 6, within eight rounds; the exploration rounds (every 8th) try an untimed K
    near the best, and the same rounds and timings give the same K sequence."""
    ks = _simulate(SMOL, 4)
    assert ks == _simulate(SMOL, 4)
    steady = [k for r, k in enumerate(ks) if r >= 8 and r % 8 != 7]
    assert set(steady) == {2}, ks
    ks = _simulate(FLAT, 5)
    steady = [k for r, k in enumerate(ks) if r >= 8 and r % 8 != 7]
    assert set(steady) == {6}, ks


# ----------------------------------------------------------------------------- where the steps run
class _Clock:
    """time.perf_counter, advanced only by the runner's steps."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class _TimedRunner(check.RecordingRunner):
    """Each step (or batched step) of m rows in all advances the clock by ms(m) ms."""

    def __init__(self, runner, clock: _Clock, ms):
        super().__init__(runner)
        self.clock, self.ms = clock, ms

    def step(self, tokens, *args):
        self.clock.t += 1e-3 * self.ms(len(tokens))
        return super().step(tokens, *args)

    def batch_step(self, work):
        rows = sum(len(w.ids) for w in work)
        self.log.append(("batch", rows))
        self.clock.t += 1e-3 * self.ms(rows)
        return self.runner.batch_step(work)


@pytest.fixture(scope="module")
def gate_model():
    runner, tok, _ = check.spec_runner("cpu")
    return runner, tok


def test_generator_feeds_the_table_and_keeps_the_tokens(gate_model, monkeypatch):
    """Generator.generate times each round (the draft and its verify step) into the generator's
    table, which the next request reads too; the tokens are plain decoding's; the same timings
    give the same steps."""
    runner, tok = gate_model
    case = check.spec_cases(runner.vocab_size, runner.n_ctx, 64)[0]
    sp = SamplingParams(temperature=0.9, top_k=40, max_tokens=64, seed=3)
    plain = Generator(runner, tok).generate(case.prompt, sp)
    oracle = lambda: OracleDrafter(plain.token_ids, {9, 20, 21, 33, 50}, runner.vocab_size)  # noqa: E731
    logs = []
    for _ in range(2):
        clock = _Clock()
        monkeypatch.setattr(generate, "time", SimpleNamespace(perf_counter=clock.perf_counter))
        timed = _TimedRunner(runner, clock, lambda m: SMOL[m - 1])
        gen = Generator(timed, tok)
        assert gen.generate(case.prompt, sp, drafter=oracle(), spec_k=0).token_ids == plain.token_ids
        logs.append(timed.log)
    assert logs[0] == logs[1]
    steps = [m for kind, m in logs[0] if kind == "step"]
    assert len(set(steps)) >= 3  # K moved
    for m in set(steps):
        if steps.count(m) > 1:
            assert gen.costs.timed(m) and gen.costs.time(m) == pytest.approx(1e-3 * SMOL[m - 1])
    assert gen.generate(case.prompt, sp, drafter=NgramDrafter(), spec_k=0).token_ids == plain.token_ids
    assert gen.generate(case.prompt, sp).token_ids == plain.token_ids  # plain steps are timed too
    assert gen.costs.timed(1)


def test_scheduler_feeds_the_table_by_the_steps_total_rows(gate_model, monkeypatch):
    """Scheduler.step times each whole step under its total rows (nothing is split per
    sequence); every sequence's tokens stay its solo run's."""
    from bw24chat.backends.numpy_backend import numpy_runner
    from bw24chat.scheduler import Scheduler, Sequence
    from bw24chat.synthetic import synthetic_checkpoint

    _, tok = gate_model
    ck = synthetic_checkpoint(check.SPEC_SHAPE, "Q8_0")
    sp = SamplingParams(temperature=0, max_tokens=32)
    cases = check.spec_cases(check.SPEC_SHAPE["vocab_size"], 1024, 32)
    prompts = [cases[1].prompt, cases[2].prompt, cases[0].prompt]
    solo = [Generator(numpy_runner(ck, 1024), tok).generate(p, sp).token_ids for p in prompts]
    clock = _Clock()
    monkeypatch.setattr(scheduler, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    ms = lambda m: 1 + 0.1 * (m - 1)  # noqa: E731
    timed = _TimedRunner(numpy_runner(ck, 1024), clock, ms)
    sched = Scheduler(timed, 200, step_tokens=64)
    seqs = []
    for p, drafter in zip(prompts, (NgramDrafter(), OracleDrafter(solo[1], {5, 11}, check.SPEC_SHAPE["vocab_size"]), None)):
        s = Sequence(list(p), sp, Output(tok, sp, len(p), 1024), drafter=drafter, spec_k=0)
        sched.add(s)
        seqs.append(s)
    while not sched.idle():
        sched.step()
    assert [s.out.ids for s in seqs] == solo
    totals = [m for kind, m in timed.log if kind == "batch"]
    for m in set(totals):
        if totals.count(m) > 1:
            assert sched.costs.timed(m) and sched.costs.time(m) == pytest.approx(1e-3 * ms(m))
    assert seqs[0].spec.rounds > 0 and seqs[1].spec.accepted > 0
