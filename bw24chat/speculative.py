"""Speculative decoding, host side: the drafters, the draft length K, the acceptance counters.

A drafter proposes up to K tokens to follow the sequence; ``Generator.speculate``
(generate.py) feeds the current token plus the drafts to ONE ``runner.step`` of K + 1 rows and
keeps the longest prefix of drafts that equal the tokens the runner sampled (Leviathan et al.
2023, "Fast Inference from Transformers via Speculative Decoding").  Each row's token is drawn
exactly as plain decoding draws it (Philox keyed by seed and position, sampling.py), so a draft
is accepted exactly when it IS the token plain decoding would have produced: the output is
token-identical to plain decoding for every seed and every K; drafts only change the speed.

Drafters here: ``NgramDrafter`` (prompt lookup), ``OracleDrafter`` (the gate's) and
``MTPDrafter`` (the model's multi-token-prediction head, models/mtp.py).  ``DraftLength`` picks K
(fixed, or the one that maximises expected tokens per second) from the acceptance so far and the
step times of ``StepCosts``.
"""
from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np


MAX_K = 8  # K drafts + the current token: one verify step of K + 1 rows (two passes past MAX_ROWS)
SPEC_MODES = ("off", "ngram", "mtp")  # mtp: only for a model that loads a head (make_drafter)


class Drafter:
    """What generate.py asks of a drafter.

    ``begin(prompt)``            a new generation starts after ``prompt``
    ``propose(history, k)``      up to k tokens to follow ``history`` (prompt + output so far; its
                                 last token is the one the next step feeds); [] means no guess
    ``verified(accepted, n, hidden)``  after each verify step: ``accepted`` drafts were kept and
                                 positions >= n are stale (rolled back).
    ``confidence(history)``      the class of the drafts ``propose`` would make now (an int; 0:
                                 one class), so DraftLength estimates acceptance per class

    A drafter that sets ``needs_hidden`` (MTPDrafter) also gets
    ``prime(hidden, sp, seed)``       after ``begin``: the trunk's hidden states of every prompt row
                                 (runner.last_hidden, the prompt prefilled from position 0) and
                                 the request's sampling
    and ``hidden`` in ``verified``: the trunk's hidden states of the step's rows (after a plain
    decode step too, with accepted = 0).  Rows 0..accepted are the verified positions; row
    ``accepted`` is the input row of the bonus token: the head's next chain starts from
    (embedding of the bonus token, hidden[accepted]), the pairing the engine notes warn about.
    """

    needs_hidden = False

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, history: list[int], k: int) -> list[int]:
        raise NotImplementedError

    def confidence(self, history: list[int]) -> int:
        return 0

    def verified(self, accepted: int, n: int, hidden=None) -> None:
        pass

    def prime(self, hidden, sp, seed: int) -> None:
        pass


class NgramDrafter(Drafter):
    """Prompt lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; as
    llama.cpp's lookup decoding): find the most recent earlier occurrence of the longest suffix
    n-gram (n = max_n down to 1) of prompt + output, and propose what followed it.

    The index maps each n-gram to the position after its latest occurrence and is extended by
    the new tokens on each call (O(max_n) per token, no rescan).  Only n-grams whose
    continuation exists are indexed, so the suffix never matches itself.  A continuation that
    runs into the end of the history continues from the draft itself (a repeating pattern is
    proposed periodically).

    Its confidence is the matched length n: on an editing workload (SmolLM2-135M, bench --spec
    ngram) 4-gram matches were right for 84 % of their drafts, 2-grams 47 %, single tokens 29 %,
    so DraftLength drafts fewer after a short match."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._index: list[dict[tuple, int]] = [{} for _ in range(self.max_n + 1)]
        self._seen = 0

    def _match(self, history: list[int]) -> tuple[int, int]:
        """(n, j): the longest suffix n-gram with an earlier occurrence, the position after its
        latest one; (0, -1) when none.  Indexes the tokens added since the last call first."""
        L = len(history)
        for j in range(max(self._seen, 1), L):  # the n-grams that end at j - 1, followed by history[j]
            for n in range(1, min(self.max_n, j) + 1):
                self._index[n][tuple(history[j - n:j])] = j
        self._seen = L
        for n in range(min(self.max_n, L), 0, -1):
            j = self._index[n].get(tuple(history[L - n:]))
            if j is not None:
                return n, j
        return 0, -1

    def confidence(self, history: list[int]) -> int:
        return self._match(history)[0]

    def propose(self, history: list[int], k: int) -> list[int]:
        L = len(history)
        n, j = self._match(history)
        out: list[int] = []
        for i in range(k if n else 0):
            out.append(history[j + i] if j + i < L else out[j + i - L])
        return out


class OracleDrafter(Drafter):
    """The gate's drafter (check.py): proposes the true continuation (``truth``: the tokens a
    plain run generated after the prompt), wrong at the output indices in ``errors`` (there it
    proposes truth + 1 mod vocab).  So each round's accepted length is known in advance:
    min(k, distance to the next error), and the error's position then gets the true token as
    the bonus."""

    def __init__(self, truth: list[int], errors=(), vocab: int = 1 << 31):
        self.truth, self.errors, self.vocab = list(truth), set(errors), vocab
        self.n_prompt = 0

    def begin(self, prompt: list[int]) -> None:
        self.n_prompt = len(prompt)

    def propose(self, history: list[int], k: int) -> list[int]:
        c = len(history) - self.n_prompt  # output tokens so far: the drafts are truth[c:]
        return [(t + 1) % self.vocab if c + i in self.errors else t for i, t in enumerate(self.truth[c:c + k])]


class MTPDrafter(Drafter):
    """Drafts from the model's multi-token-prediction head (models/mtp.py, runner.mtp_draft).

    The head's row at position t pairs (token t+1, trunk hidden h_t) and predicts token t+2.  The
    drafter keeps the trunk rows it has not fed yet (``pending``: h_done .. h_{L-2} for a history
    of L tokens) and on ``propose`` feeds them with history[done + 1 : L] (catch-up, filling the
    head's cache with final pairs), which drafts token L; then chains k - 1 rows of (its own
    draft, its own g) at positions L-1, L, ... .  Those chained cache entries are never final
    (the trunk's h replaces g), so the next catch-up starts again at L - 1 and overwrites them.

    A draft is drawn as the target draws its token at that position (sampling.sample_token keyed
    by seed and position, the history up to it): greedy is the argmax, and seeded sampling
    couples the draft's draw with the target's, so a head close to the trunk is accepted often."""

    needs_hidden = True

    def __init__(self, runner):
        self.runner = runner
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self.done, self.pending, self.sp, self.seed = 0, np.zeros((0, self.runner.args.hidden_size), np.float32), None, 0

    def prime(self, hidden, sp, seed: int) -> None:
        self.pending, self.sp, self.seed = np.array(hidden, np.float32), sp, seed

    def verified(self, accepted: int, n: int, hidden=None) -> None:
        self.pending = np.concatenate([self.pending, np.array(hidden[:accepted + 1], np.float32)])

    def propose(self, history: list[int], k: int) -> list[int]:
        L = len(history)
        if self.done + len(self.pending) != L - 1:  # h_t must meet token t+1: see the engine notes
            raise RuntimeError(f"MTP pairing lost: hidden states for positions {self.done}..{self.done + len(self.pending) - 1}"
                               f", a history of {L} tokens")
        # draft j is the token at position L + j; the chained rows sit at L - 1 + j
        drafts = self.runner.mtp_draft(history[self.done + 1:L], self.pending, self.done, k, self.sp, self.seed, history)
        self.done, self.pending = L - 1, self.pending[:0]
        return drafts


def check_verifies(runner) -> None:
    """Refuse (ValueError) a runner that cannot take back a verify's rejected rows: a model with
    gated DeltaNet layers needs its recurrent state checkpointed at each verified row."""
    if getattr(getattr(runner, "model", None), "deltanet", None) is not None and not getattr(runner, "state_checkpoints", False):
        raise ValueError("speculative decoding on a model with gated DeltaNet layers (Qwen3-Next / Qwen3.5) needs a "
                         "runner that checkpoints their recurrent state at each verified row, which this backend "
                         "does not do yet (--device cpu does); use --spec off")


def make_drafter(mode: str, runner=None) -> Drafter | None:
    """The drafter of a ``--spec`` mode (None: off); ``mtp`` needs ``runner`` with a head."""
    if mode == "off":
        return None
    check_verifies(runner)
    if mode == "ngram":
        return NgramDrafter()
    if mode == "mtp":
        if getattr(runner, "mtp", None) is None:
            raise ValueError("--spec mtp needs a model with a multi-token-prediction head (a NextN / MTP layer in the "
                             "checkpoint, or a trained draft head beside it): this model has none (bw24chat train-draft -m MODEL "
                             "trains one); use --spec ngram")
        return MTPDrafter(runner)
    raise ValueError(f"unknown speculative mode {mode!r} (off, ngram, mtp)")


STEP_SAMPLES = 9  # recent timings kept per row count: their median is its step time
# a row count not timed yet costs 1 + 0.35 (m - 1) one-row steps (scaled to the nearest timed one): H100 verify
# steps of Qwen3-8B cost 0.33-0.37 of a row per extra row in Q8_0, ~0.55 in NVFP4, less in BF16
PRIOR_SLOPE = 0.35
PRIOR_ACCEPT, PRIOR_TRIALS = 0.7, 2.0  # the acceptance before any round: 0.7, worth two drafts
ACCEPT_DECAY = 0.9  # per round: the estimate follows the last ten rounds or so (a copy, then free text)
EXPLORE_EVERY, EXPLORE_LOSS = 8, 0.15  # every 8th round may try an untimed K predicted within 15 % of the best


def prior_cost(rows: int) -> float:
    return 1.0 + PRIOR_SLOPE * (rows - 1)


class StepCosts:
    """The wall time of a step of m rows, per m: the median of its last STEP_SAMPLES timings.

    Fed once a step (``observe``) by the loop that runs the steps (Generator.generate: the round
    from the draft to the verified tokens, so an MTP head's drafting is in it; Scheduler.step: the
    whole step, keyed by its total rows).  The first timing of each m is dropped: that step may
    have captured its CUDA graph.  A row count without a timing is interpolated between the timed
    ones around it; above them extrapolated on the line through the two largest (optimistic where
    the cost grows faster, which the policy then tries and times); otherwise prior_cost scaled to
    the nearest timed one (nothing timed: prior_cost itself)."""

    def __init__(self):
        self._n: dict[int, int] = {}  # timings seen per row count
        self._recent: dict[int, deque] = {}
        self._est: dict[int, float] = {}  # the median of _recent
        self._timed: list[int] = []  # the row counts in _est, sorted

    def observe(self, rows: int, seconds: float) -> None:
        n = self._n.get(rows, 0)
        self._n[rows] = n + 1
        if n == 0:
            return
        q = self._recent.get(rows)
        if q is None:
            q = self._recent[rows] = deque(maxlen=STEP_SAMPLES)
            bisect.insort(self._timed, rows)
        q.append(seconds)
        self._est[rows] = statistics.median(q)

    def timed(self, rows: int) -> bool:
        return rows in self._est

    def time(self, rows: int) -> float:
        """Seconds (in one-row steps while nothing is timed)."""
        t = self._est.get(rows)
        if t is not None:
            return t
        ms = self._timed
        if not ms:
            return prior_cost(rows)
        i = bisect.bisect(ms, rows)
        if i == len(ms) and i > 1:  # beyond the largest: on the line through the two largest, never falling
            i -= 1
        if 0 < i < len(ms):
            lo, hi = ms[i - 1], ms[i]
            return self._est[lo] + max(self._est[hi] - self._est[lo], 0.0) * (rows - lo) / (hi - lo)
        near = ms[0] if i == 0 else ms[-1]
        return self._est[near] * prior_cost(rows) / prior_cost(near)


class DraftLength:
    """K, the drafts per round: fixed (1..MAX_K), or adaptive (k=0, ``--spec-k auto``): the K that
    maximises the expected tokens per second, after Leviathan et al. 2023 (sec. 3.5): a round of
    K drafts, each accepted with probability a once the ones before it were, gives
    1 + a + ... + a^K tokens and costs the step time of its rows (StepCosts).  Only the speed
    depends on K, never the tokens; K depends only on the rounds and the timings, so the same
    timings give the same K sequence.

    ``a`` is estimated for prefix acceptance: a round that accepted ``accepted`` of ``drafted``
    drafts saw ``accepted`` successes and one failure if ``accepted < drafted`` (the drafts after
    the first rejected one were never tried), so a = successes / trials, both exponentially
    weighted per round (ACCEPT_DECAY) from a prior of PRIOR_ACCEPT worth PRIOR_TRIALS.  Each class
    of drafts (Drafter.confidence: an n-gram drafter's match length) has its own estimate; ``use``
    selects the class of the next round before ``choose`` and ``update``."""

    def __init__(self, k: int = 0, costs: StepCosts | None = None):
        self.adaptive = k == 0
        self.costs = costs if costs is not None else StepCosts()
        self._classes: dict[int, list[float]] = {}  # class -> [hits, trials]
        self.use(0)
        self.rounds = 0
        self.k = self.choose() if self.adaptive else k

    def use(self, cls: int) -> None:
        """The next round's drafts are of class ``cls`` (Drafter.confidence)."""
        self._acc = self._classes.setdefault(cls, [PRIOR_ACCEPT * PRIOR_TRIALS, PRIOR_TRIALS])

    @property
    def hits(self) -> float:
        return self._acc[0]

    @property
    def trials(self) -> float:
        return self._acc[1]

    @property
    def acceptance(self) -> float:
        return self.hits / self.trials

    def update(self, drafted: int, accepted: int) -> None:
        """After a verify round: ``drafted`` is what the drafter returned (maybe fewer than K)."""
        if self.adaptive:
            e = self._acc
            e[0] = ACCEPT_DECAY * e[0] + accepted
            e[1] = ACCEPT_DECAY * e[1] + accepted + (accepted < drafted)
            self.rounds += 1

    def expected(self, k: int) -> float:
        """Tokens a round of k drafts gives: 1 + a + ... + a^k."""
        a = self.acceptance
        return sum(a ** i for i in range(k + 1))

    def choose(self, rows: int = 0, tokens: float = 0.0) -> int:
        """K for the next round, whose step also carries ``rows`` other rows that give ``tokens``
        tokens (a batched step; 0 alone): the best (tokens + expected(K)) / time(rows + K + 1),
        the smallest K on a tie.  Every EXPLORE_EVERY-th round the best K whose row count is not
        timed yet is tried instead if its predicted rate is within EXPLORE_LOSS of the best (so
        it is cheap), which corrects the interpolated costs where they were wrong."""
        if not self.adaptive:
            return self.k
        a, time = self.acceptance, self.costs.time
        rates, e, p = [], 1.0, 1.0
        for k in range(1, MAX_K + 1):
            p *= a
            e += p
            rates.append((tokens + e) / time(rows + k + 1))
        best_rate = max(rates)
        best = rates.index(best_rate) + 1
        if self.rounds % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            untimed = [(r, k) for k, r in enumerate(rates, 1) if not self.costs.timed(rows + k + 1)]
            if untimed:
                probe_rate, probe = max(untimed, key=lambda rk: (rk[0], -rk[1]))
                if probe_rate >= (1 - EXPLORE_LOSS) * best_rate:
                    best = probe
        self.k = best
        return best


@dataclass
class SpecCounters:
    """Verify rounds (steps that carried >= 1 draft), drafts proposed, drafts accepted (counted at
    verification: a stop condition may later trim accepted tokens from the output)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted

    def stats(self) -> dict:
        """The stats keys (api.py).  spec_mean_len: tokens per verify round, the accepted drafts
        plus the bonus token (EAGLE's average acceptance length tau, Li et al. 2024): the bound
        on the speed-up when a K + 1-row step costs one decode step."""
        return {"spec_rounds": self.rounds, "spec_drafted": self.drafted, "spec_accepted": self.accepted,
                "spec_acceptance": self.accepted / self.drafted if self.drafted else 0.0,
                "spec_mean_len": 1 + self.accepted / self.rounds if self.rounds else 0.0}
