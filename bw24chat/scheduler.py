"""Continuous batching: many sequences advance together, one runner ``batch_step`` at a time.

Sequences join and leave between steps (Yu et al. 2022, "Orca: A Distributed Serving System for
Transformer-Based Generative Models": iteration-level scheduling).  Each step takes, under a
budget of ``step_tokens`` rows and the runner's ``max_batch`` sequences, in this order:
  1. the interactive sequences (the TUI's request), whatever they need: a decode row or a
     prefill chunk; server load never delays them behind anything;
  2. one decode row of every other sequence past its prompt, oldest first;
  3. prefill chunks of the other sequences still in their prompt, oldest first (Agrawal et al.
     2024, "Sarathi-Serve": chunked prefills ride along with the decode rows).
The budget keeps a long prompt from stalling the others' decode rows.  While an interactive
sequence is decoding, the rows of 2. and 3. are cut further, to what keeps the step's expected
time (StepCosts, the measured time per total rows) within INTERACTIVE_STEP times that of the
rows of 1. alone: the user's reply streams at nearly its solo pace under server load; the other
replies take turns (the ones that waited longest since their last row first) and new prompts
wait for cheap room (or for the reply's end).  A step in which no
sequence has a decode row waiting (one request alone, or all of them still in their prompts) has
none to protect: its budget is the runner's own prefill chunk (runner.prefill_chunk), the rows a
solo prefill runs at once, if that is larger.  Decode rows stay within ``step_tokens`` (the
batched step's buffers are sized for that: engine._open_pool).  A prompt may thus be cut
anywhere: prefill rows are chunk-invariant (backends/runner.py), so a sequence's tokens are the
same whatever ran beside it.  A sequence with a drafter (speculative decoding, speculative.py)
sends its current token and up to K drafts as decode rows sampled after every row; the drafts
that equal what was sampled are kept (generate.Generator.speculate's rule), so its tokens are
plain decoding's too.  With an adaptive K, a step's time is known only
as a whole, so the cost table is keyed by the step's total rows and nothing is attributed per
sequence: each sequence picks the K that maximises the tokens per second of the rows planned so
far plus its own (the rows planned after it are not known yet).

KV blocks come from kv_pages.KVPages.  A new sequence first takes the published blocks of its
prompt's longest cached prefix (prefix sharing); blocks are reserved just before the rows that
need them.  When the pool runs out (after evicting cached blocks), the newest sequence of lowest
priority not yet in the step is preempted: its blocks are released and it waits to be recomputed
(its prompt as prefill rows, then the tokens it had already generated as decode rows without
sampling, which reproduces its K/V bit for bit, so it continues exactly as it would have).  A
sequence that cannot get a block even so waits for the next step; the oldest sequence can always
proceed (the pool holds at least one full context), so everything finishes.
"""
from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .api import SamplingParams
from .backends.runner import SeqWork, max_batch, prefill_chunk
from .generate import Output
from .kv_pages import KVPages, min_pool_blocks
from .sampling import REPEAT_WINDOW_MAX
from .speculative import Drafter, DraftLength, SpecCounters, StepCosts

DEFAULT_STEP_TOKENS = 256
# a step that carries the interactive sequence's decode row may cost this many times the step of
# its rows alone (the TUI's inter-token latency under server load: within 2x of alone)
INTERACTIVE_STEP = 1.5


@dataclass
class Sequence:
    """One generation in the batch: the prompt ids, then the tokens sampled so far."""

    ids: list[int]
    sampling: SamplingParams
    out: Output  # the output side (stops, streaming, logprobs): generate.Output
    interactive: bool = False
    cancelled: Callable[[], bool] = lambda: False
    on_done: Callable[["Sequence"], None] | None = None
    on_stats: Callable[["Sequence"], None] | None = None  # now and then while it decodes
    drafter: Drafter | None = None  # speculative decoding (a drafter that needs no hidden states)
    spec_k: int = 0  # drafts per step, 0: adaptive (speculative.DraftLength)
    # set by the scheduler
    seed: int = 0  # sampling.seed, else a fresh random one
    id: int = 0
    n_prompt: int = 0
    computed: int = 0  # positions whose K/V sit in its blocks
    opened: bool = False
    ran: bool = False  # has run a step since it was last admitted
    last_step: int = -1  # the scheduler's step count when it last ran (decoders take turns under a cap)
    cached_tokens: int = 0  # prompt positions taken from the prefix cache (first admission)
    preemptions: int = 0
    finish: str | None = None
    t_submit: float = field(default_factory=time.perf_counter)
    t_admit: float | None = None
    t_first: float | None = None
    t_end: float | None = None
    t_stats: float = 0.0
    drafts: list[int] = field(default_factory=list)  # the drafts of the step in flight
    draft_len: DraftLength | None = None
    spec: SpecCounters = field(default_factory=SpecCounters)

    @property
    def rank(self) -> tuple[int, int]:
        """Lower runs first and is preempted last."""
        return (0 if self.interactive else 1, self.id)

    @property
    def decoding(self) -> bool:
        return self.computed >= self.n_prompt

    def stats(self) -> dict:
        """The request's figures (api.py's stats keys, plus ``queue_s``)."""
        now = time.perf_counter()
        first, admit = self.t_first or now, self.t_admit or now
        n_out = len(self.out.ids)
        end = self.t_end or now
        return {"prompt_tokens": self.n_prompt, "generated_tokens": n_out, "cached_tokens": self.cached_tokens,
                "ttft_s": first - self.t_submit, "queue_s": admit - self.t_submit,
                "prefill_tps": (self.n_prompt - self.cached_tokens) / max(first - admit, 1e-9),
                "decode_tps": (n_out - 1) / max(end - first, 1e-9) if n_out > 1 else 0.0,
                "ctx_used": len(self.ids), "seed": self.seed, "preemptions": self.preemptions,
                **(self.spec.stats() if self.drafter else {})}


class Scheduler:
    """The sequences of a batching engine and the step loop's one iteration (``step``)."""

    def __init__(self, runner, n_blocks: int, share_prefixes: bool = True, step_tokens: int = DEFAULT_STEP_TOKENS,
                 batch: int = 0):
        self.runner = runner
        self.max_batch = min(batch or max_batch(runner), max_batch(runner))
        if self.max_batch < 1:
            raise ValueError("a batch of at least one sequence")
        bs = runner.block_size
        n_blocks = max(n_blocks, min_pool_blocks(runner.n_ctx, bs))
        runner.init_kv_pool(n_blocks)
        self.pages = KVPages(n_blocks, bs, share_prefixes)
        self.step_tokens = max(step_tokens, 1)
        self.prefill_tokens = max(self.step_tokens, prefill_chunk(runner))  # a step's budget when no decode row waits
        self.seqs: list[Sequence] = []  # every unfinished sequence, waiting or admitted
        self._ids = itertools.count()
        self.steps = 0
        self.rows = 0  # rows run, all steps
        self.last_batch = 0  # sequences in the last step
        self.preemptions = 0
        self.failed: list[Sequence] = []  # the sequences of a step whose batch_step raised
        self.costs = StepCosts()  # step time per total rows, planning included (its drafting; --spec-k auto)

    # ------------------------------------------------------------------ sequences
    def add(self, seq: Sequence) -> None:
        if not seq.ids:
            raise ValueError("empty prompt")
        if len(seq.ids) >= self.runner.n_ctx:
            raise ValueError(f"the prompt is {len(seq.ids)} tokens; the context holds {self.runner.n_ctx}")
        seq.id, seq.n_prompt = next(self._ids), len(seq.ids)
        seq.seed = seq.sampling.seed if seq.sampling.seed is not None else secrets.randbits(63)
        if seq.drafter is not None:
            seq.drafter.begin(seq.ids)
            seq.draft_len = DraftLength(seq.spec_k, self.costs)
        self.seqs.append(seq)

    @property
    def waiting(self) -> int:
        return sum(1 for s in self.seqs if not s.opened)

    @property
    def running(self) -> int:
        return sum(1 for s in self.seqs if s.opened)

    def idle(self) -> bool:
        return not self.seqs

    def abort(self, finish: str = "error") -> list[Sequence]:
        """End every sequence (the engine is closing or the runner failed); returns them."""
        gone = list(self.seqs)
        for s in gone:
            self._end(s, finish, notify=False)
        return gone

    # ------------------------------------------------------------------ one step
    def step(self) -> int:
        """Drop cancelled sequences, run one batched step; returns the rows run (0: nothing to do)."""
        for s in [s for s in self.seqs if s.cancelled()]:
            self._end(s, "cancelled")
        t0 = time.perf_counter()
        plan = self._plan()
        if not plan:
            return 0
        work = [w for _, w in plan]
        try:
            sampled = self.runner.batch_step(work)
            now = time.perf_counter()
            self.costs.observe(sum(len(w.ids) for w in work), now - t0)
        except Exception:
            # what the step's sequences hold is unknown: they end (``failed``; the caller tells
            # their clients), their blocks go back; the others are untouched
            self.failed = [seq for seq, _ in plan]
            for seq in self.failed:
                self._end(seq, "error", notify=False)
            raise
        fetched: list = []  # the step's logits, read from the runner only if a token's are wanted (logprobs)

        def logits_row(i: int):
            if not fetched:
                fetched.append(self.runner.last_logits())
            return fetched[0][i]

        self.steps += 1
        self.last_batch = len(work)
        row = 0  # the logits row of each sampled token
        for (seq, w), tokens in zip(plan, sampled):
            self.rows += len(w.ids)
            seq.ran = True
            seq.last_step = self.steps
            first_row, row = row, row + len(tokens)
            if w.sample_all:  # a verify step: the drafts up to the first that differs, then the bonus
                a = next((i for i, d in enumerate(seq.drafts) if d != tokens[i]), len(seq.drafts))
                seq.spec.add(len(seq.drafts), a)
                seq.draft_len.update(len(seq.drafts), a)
                seq.drafter.verified(a, w.start + 1 + a)
                seq.computed += 1 + a  # the rejected drafts' positions are overwritten before anyone reads them
                tokens = tokens[:a + 1]
            else:
                seq.computed += len(w.ids)
            if w.prefill:
                self.pages.publish(seq.id, seq.ids, min(seq.computed, seq.n_prompt))
            if tokens and seq.t_first is None:
                seq.t_first = now
            for i, tok in enumerate(tokens):
                if not seq.out.feed(tok, lambda i=first_row + i: logits_row(i)):
                    self._end(seq, seq.out.finish)
                    break
                seq.ids.append(tok)
            if seq.finish is None and seq.on_stats and now - seq.t_stats > 0.25:
                seq.t_stats = now
                seq.on_stats(seq)
        return sum(len(w.ids) for w in work)

    def _plan(self) -> list[tuple[Sequence, SeqWork]]:
        order = sorted(self.seqs, key=lambda s: s.rank)
        tiers = ([s for s in order if s.interactive],
                 sorted((s for s in order if not s.interactive and s.opened and s.decoding), key=lambda s: s.last_step),
                 [s for s in order if not s.interactive and not (s.opened and s.decoding)])
        plan: list[tuple[Sequence, SeqWork]] = []
        planned: set[int] = set()  # id() of the sequences in plan
        budget = self.step_tokens if any(s.opened and s.decoding for s in self.seqs) else self.prefill_tokens
        tokens = 0.0  # the tokens the planned rows are expected to give
        # while the user's reply streams, the others' rows ride along only as far as the step stays
        # within INTERACTIVE_STEP of a step of its rows alone (its inter-token latency)
        guard = any(s.interactive and s.opened and s.decoding for s in self.seqs)
        for t, tier in enumerate(tiers):
            if t == 1 and guard:
                rows = sum(len(w.ids) for _, w in plan)
                budget = min(budget, self._rows_within(rows, INTERACTIVE_STEP) - rows)
            for seq in tier:
                if len(plan) == self.max_batch or budget <= 0:
                    return plan
                w = self._work(seq, budget, planned, tokens)
                if w is not None:
                    plan.append((seq, w))
                    planned.add(id(seq))
                    budget -= len(w.ids)
                    tokens += seq.draft_len.expected(len(seq.drafts)) if seq.drafts else w.params is not None
        return plan

    def _rows_within(self, rows: int, factor: float) -> int:
        """The most rows (from ``rows`` up to step_tokens) a step may take for its expected time
        (StepCosts) to stay within ``factor`` times that of ``rows`` rows."""
        limit = factor * self.costs.time(rows)
        best, extra = rows, 1
        while rows + extra <= self.step_tokens and self.costs.time(rows + extra) <= limit:
            best, extra = rows + extra, extra * 2
        return best

    def _work(self, seq: Sequence, budget: int, planned: set[int], tokens: float) -> SeqWork | None:
        """``seq``'s rows for this step, its blocks reserved (preempting lower-ranked sequences
        not in the step if need be); None if it cannot run now.  ``tokens``: what the rows planned
        before it are expected to give (an adaptive K weighs its drafts against them)."""
        if not seq.opened:
            if not seq.interactive and self.running and (not self._fits(seq) or self._prefix_in_flight(seq)):
                return None  # admit it once its prompt fits beside the running ones / its prefix is published
            # the last prompt position is always computed (its logits give the first token); a
            # preempted sequence's generated positions were decode rows: never shared
            seq.computed = self.pages.open(seq.id, seq.ids, min(seq.n_prompt, len(seq.ids) - 1))
            seq.opened = True
            if seq.t_admit is None:
                seq.t_admit = time.perf_counter()
                seq.cached_tokens = seq.computed
        seq.drafts = []
        if seq.decoding:  # the next token, or the already generated ones replayed after a preemption
            budget = min(budget, self.step_tokens)  # decode rows never take a larger prefill budget
            n = min(len(seq.ids) - seq.computed, budget)
            if n == 1 and seq.drafter is not None:
                # drafts + the bonus token never exceed what max_tokens and the context still allow
                seq.draft_len.use(seq.drafter.confidence(seq.ids))
                k = min(seq.draft_len.choose(self.step_tokens - budget, tokens),
                        seq.sampling.max_tokens - len(seq.out.ids) - 1, self.runner.n_ctx - len(seq.ids) - 1, budget - 1)
                seq.drafts = [int(d) for d in seq.drafter.propose(seq.ids, k)] if k > 0 else []
                n += len(seq.drafts)
        else:
            n = min(seq.n_prompt - seq.computed, budget)
        end = seq.computed + n
        while not self.pages.reserve(seq.id, end):
            victims = [s for s in self.seqs if s.opened and id(s) not in planned and s is not seq and s.rank > seq.rank]
            if not victims:
                self._preempt(seq)  # it waits, and its blocks go to the sequences ranked above it
                return None
            self._preempt(max(victims, key=lambda s: s.rank))
        rows = seq.ids[seq.computed:end] if not seq.drafts else [seq.ids[-1], *seq.drafts]
        sample = seq.computed + len(rows) >= len(seq.ids)
        return SeqWork(np.asarray(rows, np.int64), seq.computed, self.pages.table(seq.id),
                       prefill=not seq.decoding, params=seq.sampling if sample else None, seed=seq.seed,
                       history=seq.ids[max(seq.computed - REPEAT_WINDOW_MAX, 0):seq.computed]
                       if sample and seq.sampling.repeat_penalty != 1.0 else (),
                       sample_all=bool(seq.drafts))

    def _fits(self, seq: Sequence) -> bool:
        """Blocks for all its ids and the next token are free or cached, beyond one block for each
        running sequence's next row (so that admitting it does not at once preempt another)."""
        spare = self.pages.available() - sum(1 for s in self.seqs if s.opened and s.decoding)
        return self.pages.blocks_for(len(seq.ids) + 1) <= spare

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """Whether the first block of ``seq``'s prompt that is not in the cache is being prefilled
        by another sequence right now (the same system prompt, the n choices of one request):
        waiting for it to be published beats computing it twice."""
        miss = self.pages.first_miss(seq.ids, min(seq.n_prompt, len(seq.ids) - 1))
        if miss is None:
            return False
        j, key = miss
        end = (j + 1) * self.pages.block_size
        return any(o.opened and o.computed < end <= o.n_prompt and self.pages.key_at(o.id, o.ids, j) == key
                   for o in self.seqs if o is not seq)

    def _preempt(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; it waits and is recomputed when admitted again (counted as a
        preemption if it had run since it was admitted)."""
        self.pages.close(seq.id)
        if seq.ran:
            seq.preemptions += 1
            self.preemptions += 1
        seq.opened, seq.computed, seq.ran = False, 0, False

    def _end(self, seq: Sequence, finish: str, notify: bool = True) -> None:
        if seq.opened:
            self.pages.close(seq.id)
            seq.opened = False
        seq.finish = finish
        seq.t_end = time.perf_counter()
        self.seqs.remove(seq)
        if notify and seq.on_done:
            seq.on_done(seq)

    # ------------------------------------------------------------------ figures
    def stats(self) -> dict:
        p = self.pages
        return {"batch_running": self.running, "batch_waiting": self.waiting, "batch_size": self.last_batch,
                "batch_max": self.max_batch, "batch_steps": self.steps, "batch_rows": self.rows,
                "kv_blocks_total": p.n_blocks, "kv_blocks_used": p.n_used, "kv_blocks_cached": p.n_cached,
                "kv_block_tokens": p.block_size, "prefix_hit_tokens": p.hit_tokens, "prefix_query_tokens": p.query_tokens,
                "kv_evictions": p.evictions, "batch_preemptions": self.preemptions}
