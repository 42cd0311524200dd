"""Continuous batching (scheduler.py) on the NumPy backend: every sequence's output equals its
solo run (the one-sequence Generator on a fresh runner), whatever ran beside it, with prefix
sharing on or off, any step budget, a pool small enough to preempt; interactive sequences run in
every step; cancellation frees blocks at once."""
import numpy as np
import pytest

from bw24chat.api import SamplingParams
from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.check import SPEC_SHAPE, word_tokenizer
from bw24chat.generate import Generator, Output
from bw24chat.scheduler import Scheduler, Sequence
from bw24chat.synthetic import synthetic_checkpoint

N_CTX = 192
V = SPEC_SHAPE["vocab_size"]
GREEDY = SamplingParams(temperature=0, max_tokens=14)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1, max_tokens=14, seed=11)


@pytest.fixture(scope="module")
def ck():
    return synthetic_checkpoint(SPEC_SHAPE, "Q8_0")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(V)


def _prompts(n, seed=0):
    """Prompts that share a 37-token system prefix (some), of lengths 1..60."""
    rng = np.random.default_rng(seed)
    system = [int(t) for t in rng.integers(0, V, 37)]
    out = []
    for i in range(n):
        tail = [int(t) for t in rng.integers(0, V, int(rng.integers(1, 24)))]
        out.append(system + tail if i % 3 else tail)
    return out


def _solo(ck, tok, prompt, sp, logprobs=0):
    pieces = []
    res = Generator(numpy_runner(ck, N_CTX), tok).generate(prompt, sp, lambda t, ids, lps: pieces.append((t, ids, lps)),
                                                            logprobs=logprobs)
    return res.token_ids, res.finish_reason, res.text, pieces


def _run(ck, tok, prompts, sp, n_blocks=400, share=True, step_tokens=32, logprobs=0, sched=None):
    sched = sched or Scheduler(numpy_runner(ck, N_CTX), n_blocks, share, step_tokens)
    seqs, pieces = [], []
    for p in prompts:
        got = []
        s = Sequence(list(p), sp, Output(tok, sp, len(p), N_CTX, lambda t, ids, lps, got=got: got.append((t, ids, lps)), logprobs))
        sched.add(s)
        seqs.append(s)
        pieces.append(got)
    while not sched.idle():
        sched.step()
    return sched, [(s.out.ids, s.finish, "".join(s.out.text_parts), got) for s, got in zip(seqs, pieces)]


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("sp", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_sequences_equal_their_solo_runs(ck, tok, share, sp):
    prompts = _prompts(9)
    solo = [_solo(ck, tok, p, sp) for p in prompts]
    for step_tokens in (5, 64):
        sched, got = _run(ck, tok, prompts, sp, share=share, step_tokens=step_tokens)
        for i, (g, s) in enumerate(zip(got, solo)):
            assert g[:3] == s[:3], (i, step_tokens)
        if share:
            assert sched.pages.hit_tokens >= 32 * 5  # the system prefix's two blocks, for most prompts
        assert sched.pages.n_used == 0 and sched.steps > 0


def test_stops_logprobs_and_context_end_inside_a_batch(ck, tok):
    """Stop strings, stop ids, logprobs and the end of the context behave in a batch as alone."""
    prompts = _prompts(4, seed=2) + [[int(t) for t in np.random.default_rng(9).integers(0, V, N_CTX - 5)]]
    free = _solo(ck, tok, prompts[0], SAMPLED)[0]
    sp = SamplingParams(**{**SAMPLED.__dict__, "max_tokens": 30, "stop": [tok.decode(free[4:6])]})
    solo = [_solo(ck, tok, p, sp, logprobs=3) for p in prompts]
    _, got = _run(ck, tok, prompts, sp, logprobs=3, step_tokens=16)
    assert solo[0][1] == "stop" and solo[-1][1] == "context_full"
    for g, s in zip(got, solo):
        assert g[:3] == s[:3]
        assert [(t, ids, [(x.token_id, x.logprob, x.top) for x in lps or []]) for t, ids, lps in g[3]] == \
               [(t, ids, [(x.token_id, x.logprob, x.top) for x in lps or []]) for t, ids, lps in s[3]]


def test_preemption_recomputes_to_the_same_tokens(ck, tok):
    """A pool of a little more than one context: long generations outgrow it, newer sequences
    are preempted and later recomputed (prompt as prefill, generated tokens replayed as decode
    rows), and every output still equals its solo run."""
    sp = SamplingParams(**{**SAMPLED.__dict__, "max_tokens": 90})
    prompts = _prompts(5, seed=4)
    solo = [_solo(ck, tok, p, sp) for p in prompts]
    for share in (True, False):
        sched, got = _run(ck, tok, prompts, sp, n_blocks=1, share=share, step_tokens=48)
        assert sched.preemptions > 0
        assert [g[:3] for g in got] == [s[:3] for s in solo]


def test_interactive_sequence_runs_every_step(ck, tok):
    """Server load (long prompts, a small budget) never delays the interactive sequence: from its
    arrival it advances in every step (its prompt in budget-sized chunks, then a token a step),
    and it ends first."""
    sched = Scheduler(numpy_runner(ck, N_CTX), 400, True, step_tokens=12)
    ends = []
    for i in range(6):
        p = [int(t) for t in np.random.default_rng(i).integers(0, V, 100)]
        sched.add(Sequence(p, GREEDY, Output(tok, GREEDY, len(p), N_CTX), on_done=lambda s: ends.append(s.id)))
    for _ in range(3):
        sched.step()
    prompt = _prompts(1, seed=5)[0]
    s = Sequence(list(prompt), GREEDY, Output(tok, GREEDY, len(prompt), N_CTX), interactive=True,
                 on_done=lambda s: ends.append(s.id))
    sched.add(s)
    n_steps = 0
    while s.finish is None:
        before = s.computed
        sched.step()
        n_steps += 1
        assert s.finish is not None or s.computed > before
    assert n_steps == -(-len(prompt) // 12) + len(s.out.ids) - 1  # the last prompt chunk samples the first token
    assert ends[0] == s.id and sched.running > 0
    assert s.out.ids == _solo(ck, tok, prompt, GREEDY)[0]


def _costed_scheduler(ck):
    """A scheduler whose cost table says a step of r rows costs 1 + (r - 1) / 8 (so 5 rows stay
    within INTERACTIVE_STEP = 1.5x of one), kept whatever the NumPy steps take."""
    sched = Scheduler(numpy_runner(ck, N_CTX), 400, True, step_tokens=32)
    for r in range(1, 33):  # the cost table as two timings of each row count give it
        sched.costs.observe(r, 0.0)
        sched.costs.observe(r, 1.0 + (r - 1) / 8)
    sched.costs.observe = lambda rows, seconds: None
    return sched


def test_prompts_ride_with_the_interactive_reply_only_as_far_as_its_step_allows(ck, tok):
    """While the interactive sequence decodes, others' rows join a step only up to what the
    measured step costs say keeps it within INTERACTIVE_STEP of its rows alone; without an
    interactive reply the prompts take the whole budget.  The tokens are the solo runs' either way."""
    from bw24chat.scheduler import INTERACTIVE_STEP

    sched = _costed_scheduler(ck)
    prompt = _prompts(1, seed=5)[0]
    s = Sequence(list(prompt), GREEDY, Output(tok, GREEDY, len(prompt), N_CTX), interactive=True)
    sched.add(s)
    while not s.decoding:
        sched.step()
    others = [[int(t) for t in np.random.default_rng(i).integers(0, V, 40)] for i in range(2)]
    seqs = [Sequence(list(p), GREEDY, Output(tok, GREEDY, len(p), N_CTX)) for p in others]
    for o in seqs:
        sched.add(o)
    t = sched.costs.time
    while s.finish is None:
        decode = 1 + sum(o.opened and o.decoding for o in seqs)  # the rows of tiers 1 and 2 (no drafts)
        prompt_left = sum(o.n_prompt - o.computed for o in seqs if not o.decoding)
        before = sched.rows
        sched.step()
        rows = sched.rows - before
        assert t(rows) <= INTERACTIVE_STEP * t(1) and rows == min(sched._rows_within(1, INTERACTIVE_STEP),
                                                                  decode + prompt_left)
    assert sched._rows_within(1, INTERACTIVE_STEP) == 5  # 1 + 4 prompt rows while both prompts wait
    while not sched.idle():
        sched.step()
    assert s.out.ids == _solo(ck, tok, prompt, GREEDY)[0]
    assert [o.out.ids for o in seqs] == [_solo(ck, tok, p, GREEDY)[0] for p in others]


def _decoding_beside_interactive(ck, tok, n_others):
    """A costed scheduler with ``n_others`` sequences past their prompts, then an interactive one
    whose prompt has run: the next step has its decode row and others' decode rows to cap."""
    sched = _costed_scheduler(ck)
    others = [[int(t) for t in np.random.default_rng(20 + i).integers(0, V, 9)] for i in range(n_others)]
    sp = SamplingParams(temperature=0, max_tokens=40)
    seqs = [Sequence(list(p), sp, Output(tok, sp, len(p), N_CTX)) for p in others]
    for o in seqs:
        sched.add(o)
    while not all(o.decoding for o in seqs):
        sched.step()
    prompt = _prompts(1, seed=5)[0]
    s = Sequence(list(prompt), GREEDY, Output(tok, GREEDY, len(prompt), N_CTX), interactive=True)
    sched.add(s)
    while not s.decoding:
        sched.step()
    return sched, s, seqs, others, sp


def test_others_ride_with_the_interactive_reply_only_as_far_as_its_step_allows(ck, tok):
    """Other replies' decode rows count against the interactive reply's step too: with 8 of them
    decoding, each step while it streams holds its row and 4 others' (5 rows: 1.5x of one by the
    cost table), and every sequence's tokens are its solo run's."""
    from bw24chat.scheduler import INTERACTIVE_STEP

    sched, s, seqs, others, sp = _decoding_beside_interactive(ck, tok, 8)
    cap = sched._rows_within(1, INTERACTIVE_STEP)
    assert cap == 5
    while s.finish is None:
        before = sched.rows
        sched.step()
        assert sched.rows - before == cap
    while not sched.idle():
        sched.step()
    assert s.out.ids == _solo(ck, tok, _prompts(1, seed=5)[0], GREEDY)[0]
    assert [o.out.ids for o in seqs] == [_solo(ck, tok, p, sp)[0] for p in others]


def test_decoders_beyond_the_interactive_cap_take_turns(ck, tok):
    """Under the cap the other replies take turns, the ones that waited longest first: with 8 of
    them and room for 4 a step, two consecutive steps run each of them once."""
    sched, s, seqs, _, _ = _decoding_beside_interactive(ck, tok, 8)
    for _ in range(4):
        before = [o.computed for o in seqs]
        sched.step()
        first = {i for i, o in enumerate(seqs) if o.computed > before[i]}
        before = [o.computed for o in seqs]
        sched.step()
        second = {i for i, o in enumerate(seqs) if o.computed > before[i]}
        assert len(first) == len(second) == 4 and first | second == set(range(8))


def test_cancel_frees_blocks_at_once(ck, tok):
    runner = numpy_runner(ck, N_CTX)
    sched = Scheduler(runner, 400, False, step_tokens=64)
    flags = [False, False]
    done = []
    seqs = []
    for i, p in enumerate(_prompts(2, seed=6)):
        s = Sequence(list(p), GREEDY, Output(tok, GREEDY, len(p), N_CTX), cancelled=lambda i=i: flags[i],
                     on_done=done.append)
        sched.add(s)
        seqs.append(s)
    sched.step()
    sched.step()
    held = len(sched.pages.table(seqs[0].id))
    used = sched.pages.n_used
    assert held > 0
    flags[0] = True
    sched.step()
    assert done == [seqs[0]] and seqs[0].finish == "cancelled"
    assert sched.pages.n_used <= used - held + 1  # its blocks are back (the other may have taken one)
    assert seqs[0].id not in sched.pages.seqs


def test_pool_covers_one_context_and_batch_is_capped(ck, tok):
    runner = numpy_runner(ck, N_CTX)
    sched = Scheduler(runner, 1, True, batch=3)
    assert sched.pages.n_blocks * runner.block_size > N_CTX
    assert sched.max_batch == 3
    _, got = _run(ck, tok, _prompts(5, seed=8), GREEDY, sched=sched)
    assert max(1, sched.last_batch) <= 3 and all(g[1] in ("length", "stop") for g in got)


@pytest.mark.parametrize("sp", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculative_sequences_in_a_batch_equal_plain_decoding(ck, tok, sp):
    """n-gram and oracle drafts verified as decode rows sampled after every row, beside plain
    sequences, some preempted: every output is plain decoding's, and drafts are accepted."""
    from bw24chat.speculative import NgramDrafter, OracleDrafter

    sp = SamplingParams(**{**sp.__dict__, "max_tokens": 40})
    rng = np.random.default_rng(12)
    prompts = [[int(t) for t in rng.integers(0, V, 5)] * 6 for _ in range(3)] + _prompts(3, seed=13)
    solo = [_solo(ck, tok, p, sp) for p in prompts]
    for n_blocks in (400, 1):
        sched = Scheduler(numpy_runner(ck, N_CTX), n_blocks, True, step_tokens=40)
        seqs = []
        for i, p in enumerate(prompts):
            drafter = [NgramDrafter(), OracleDrafter(solo[i][0], {3, 9}, V), None][i % 3]
            s = Sequence(list(p), sp, Output(tok, sp, len(p), N_CTX), drafter=drafter, spec_k=[0, 4, 0][i % 3])
            sched.add(s)
            seqs.append(s)
        while not sched.idle():
            sched.step()
        assert [(s.out.ids, s.finish) for s in seqs] == [s[:2] for s in solo]
        oracle = [s for s in seqs if isinstance(s.drafter, OracleDrafter)]
        assert all(s.spec.accepted > 0 for s in oracle)
        assert sum(s.spec.accepted for s in seqs if s.drafter) > sum(s.spec.drafted for s in seqs if s.drafter) / 3


def _stepped(sched, until=None):
    """Step ``sched`` until it is idle (or ``until()``); per step that ran: whether a sequence had
    a decode row waiting before it, and its items as (prefill, rows)."""
    runner, log = sched.runner, []
    inner = runner.batch_step

    def batch_step(work):
        log[-1][1].extend((w.prefill, len(w.ids)) for w in work)
        return inner(work)

    runner.batch_step = batch_step
    try:
        while not sched.idle() and not (until and until()):
            log.append((any(s.opened and s.decoding for s in sched.seqs), []))
            if not sched.step():
                log.pop()
    finally:
        del runner.batch_step
    return log


def _chunked_runner(ck, chunk):
    """A NumPy runner that declares a prefill chunk (runner.prefill_chunk), as the CUDA runner does."""
    runner = numpy_runner(ck, N_CTX)
    runner.prefill_chunk = chunk
    return runner


def test_a_step_with_no_decode_row_waiting_takes_the_prefill_chunk(ck, tok):
    """A lone prompt is prefilled in the runner's chunks (48 rows), not the step budget (16); once
    it decodes, prompts that join share the budget with its decode row; sequences that all
    prefill share one chunk; every output equals its solo run."""
    rng = np.random.default_rng(21)
    a, b, c = ([int(t) for t in rng.integers(0, V, n)] for n in (100, 70, 30))
    sched = Scheduler(_chunked_runner(ck, 48), 400, True, step_tokens=16)
    seqs = [Sequence(list(p), GREEDY, Output(tok, GREEDY, len(p), N_CTX)) for p in (a, b, c)]
    sched.add(seqs[0])
    log = _stepped(sched, until=lambda: len(seqs[0].out.ids) == 4)
    assert [items for _, items in log] == [[(True, 48)], [(True, 48)], [(True, 4)], [(False, 1)], [(False, 1)],
                                           [(False, 1)]]
    sched.add(seqs[1])
    sched.add(seqs[2])
    log = _stepped(sched)
    assert log[0] == (True, [(False, 1), (True, 15)])  # a's decode row, then b's prompt within the budget
    assert all(sum(n for _, n in items) <= 16 for waiting, items in log if waiting)
    assert [s.out.ids for s in seqs] == [_solo(ck, tok, p, GREEDY)[0] for p in (a, b, c)]

    sched = Scheduler(_chunked_runner(ck, 48), 400, True, step_tokens=16)
    for p in (c, b):
        sched.add(Sequence(list(p), GREEDY, Output(tok, GREEDY, len(p), N_CTX)))
    assert _stepped(sched)[0] == (False, [(True, 30), (True, 18)])


@pytest.mark.parametrize("share", [True, False])
def test_decode_rows_stay_within_the_step_budget(ck, tok, share):
    """With a prefill chunk larger than the step budget, a pool small enough to preempt (the
    generated tokens replayed as decode rows) and n-gram drafts: no step runs more decode rows
    than step_tokens, a step with a decode row waiting no more rows at all, any other step no more
    than the chunk; every output is its solo run's."""
    from bw24chat.speculative import NgramDrafter

    sp = SamplingParams(**{**SAMPLED.__dict__, "max_tokens": 90})
    prompts = _prompts(5, seed=4)
    solo = [_solo(ck, tok, p, sp) for p in prompts]
    sched = Scheduler(_chunked_runner(ck, 64), 1, share, step_tokens=24)
    seqs = []
    for i, p in enumerate(prompts):
        seqs.append(Sequence(list(p), sp, Output(tok, sp, len(p), N_CTX), drafter=NgramDrafter() if i % 2 else None))
        sched.add(seqs[-1])
    log = _stepped(sched)
    assert sched.preemptions > 0
    for waiting, items in log:
        assert sum(n for pre, n in items if not pre) <= 24
        assert sum(n for _, n in items) <= (24 if waiting else 64)
    assert any(not waiting and sum(n for _, n in items) > 24 for waiting, items in log)
    assert [(s.out.ids, s.finish) for s in seqs] == [s[:2] for s in solo]


def test_a_replay_alone_stays_within_the_step_budget(ck, tok):
    """A preempted sequence whose whole prompt is still cached comes back decoding: its 40
    generated tokens are replayed as decode rows, step_tokens (24) a step, though no other
    sequence waits (the chunk, 64, is for prefill rows); it then goes on as its solo run."""
    sp = SamplingParams(**{**GREEDY.__dict__, "max_tokens": 60})
    prompt = [int(t) for t in np.random.default_rng(23).integers(0, V, 32)]  # two whole blocks
    sched = Scheduler(_chunked_runner(ck, 64), 400, True, step_tokens=24)
    seq = Sequence(list(prompt), sp, Output(tok, sp, len(prompt), N_CTX))
    sched.add(seq)
    _stepped(sched, until=lambda: len(seq.out.ids) == 40)
    sched._preempt(seq)
    log = _stepped(sched)
    assert seq.cached_tokens == 0 and seq.preemptions == 1
    assert log[:2] == [(False, [(False, 24)]), (True, [(False, 16)])]
    assert seq.out.ids == _solo(ck, tok, prompt, sp)[0]
