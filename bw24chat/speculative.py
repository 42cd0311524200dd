"""Speculative decoding, host side: the drafters, the draft length K, the acceptance counters.

A drafter proposes up to K tokens to follow the sequence; ``Generator.speculate``
(generate.py) feeds the current token plus the drafts to ONE ``runner.step`` of K + 1 rows and
keeps the longest prefix of drafts that equal the tokens the runner sampled (Leviathan et al.
2023, "Fast Inference from Transformers via Speculative Decoding").  Each row's token is drawn
exactly as plain decoding draws it (Philox keyed by seed and position, sampling.py), so a draft
is accepted exactly when it IS the token plain decoding would have produced: the output is
token-identical to plain decoding for every seed and every K; drafts only change the speed.

Drafters here: ``NgramDrafter`` (prompt lookup), ``OracleDrafter`` (the gate's) and
``MTPDrafter`` (the model's multi-token-prediction head, models/mtp.py).
"""
from __future__ import annotations

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
    proposed periodically)."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._index: list[dict[tuple, int]] = [{} for _ in range(self.max_n + 1)]
        self._seen = 0

    def propose(self, history: list[int], k: int) -> list[int]:
        L = len(history)
        for j in range(max(self._seen, 1), L):  # the n-grams that end at j - 1, followed by history[j]
            for n in range(1, min(self.max_n, j) + 1):
                self._index[n][tuple(history[j - n:j])] = j
        self._seen = L
        for n in range(min(self.max_n, L), 0, -1):
            j = self._index[n].get(tuple(history[L - n:]))
            if j is not None:
                out: list[int] = []
                for i in range(k):
                    out.append(history[j + i] if j + i < L else out[j + i - L])
                return out
        return []


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


class DraftLength:
    """K, the drafts per round.  Fixed (1..MAX_K), or adaptive (k=0, ``--spec-k auto``): the
    schedule of transformers' assisted generation (``num_assistant_tokens_schedule=
    "heuristic"``): K + 2 after a round that accepted every draft, K - 1 after one that did
    not, within 1..MAX_K.  Only the speed depends on K, never the tokens."""

    def __init__(self, k: int = 0):
        self.adaptive = k == 0
        self.k = 4 if self.adaptive else k

    def update(self, drafted: int, accepted: int) -> None:
        if self.adaptive:
            self.k = min(self.k + 2, MAX_K) if accepted == drafted else max(self.k - 1, 1)


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
